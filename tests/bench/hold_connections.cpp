// SPDX-License-Identifier: Apache-2.0
// Holds N client connections to a broker, each with one subscription of its
// own, until its stdin closes: what tests/bench/idle-rss.sh measures the
// broker's memory against. Clients use few buffers (4 receives: the fewest
// of protocol version 3), so 1,000 RDMA clients fit one process. With HOLD_SUBJECT set, each
// also subscribes to that subject and counts what it receives; at exit it
// prints "received MIN MAX" over the clients (tests/bench/soak.sh checks
// that every one got every message). With HOLD_SUBS=K each holds K
// subscriptions instead of one (tests/bench/client-state.sh).
//   [HOLD_SUBJECT=S] [HOLD_SUBS=K [HOLD_SHAPE=shared]] hold_connections URL N [BIND]
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "rdmabroker/client.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: hold_connections URL N [BIND]\n";
    return 2;
  }
  const std::string url = argv[1];
  const int n = std::stoi(argv[2]);
  rdmabroker::ClientOptions opt;
  if (argc > 3) opt.bind_address = argv[3];
  // The fewest receives with which the broker grants credits by demand
  // (SPEC.md §5.1): 2 credits per idle client instead of flow.credits.
  opt.recv_credits = 4;
  opt.max_inflight_sends = 1;
  opt.send_queue_buffers = 1;
  opt.connect_timeout = std::chrono::seconds(30);
  const char* shared = std::getenv("HOLD_SUBJECT");
  const bool shared_prefix =
      std::getenv("HOLD_SHAPE") != nullptr && std::string(std::getenv("HOLD_SHAPE")) == "shared";
  const int subs_per_connection =
      std::getenv("HOLD_SUBS") != nullptr ? std::atoi(std::getenv("HOLD_SUBS")) : 1;
  std::vector<std::atomic<std::uint64_t>> received(static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<rdmabroker::Client>> clients;
  for (int i = 0; i < n; ++i) {
    auto c = rdmabroker::Client::connect(url, opt);
    if (!c) {
      std::cerr << "hold_connections: connection " << i << ": " << c.error().message << "\n";
      return 1;
    }
    // One subscription each, or HOLD_SUBS: each a subject of four tokens that
    // no other shares (no trie node shared: the costliest shape per byte),
    // or with HOLD_SHAPE=shared four tokens of which the first two are
    // everyone's (bench.state.I.K: the common shape).
    for (int k = 0; k < subs_per_connection; ++k) {
      const std::string n = std::to_string(i) + "x" + std::to_string(k);
      const std::string subject = subs_per_connection == 1 ? "idle." + std::to_string(i)
                                  : shared_prefix
                                      ? "bench.state." + std::to_string(i) + "." + std::to_string(k)
                                      : "a" + n + ".b" + n + ".c" + n + ".d" + n;
      if (!c.value()->subscribe(std::string_view(subject))) {
        std::cerr << "hold_connections: subscribe " << i << "/" << k << " failed\n";
        return 1;
      }
    }
    if (!c.value()->flush(std::chrono::seconds(60))) {
      std::cerr << "hold_connections: subscribe " << i << " failed\n";
      return 1;
    }
    if (shared != nullptr) {
      auto* counter = &received[static_cast<std::size_t>(i)];
      if (!c.value()->subscribe(shared, [counter](const rdmabroker::Message&) { counter->fetch_add(1); }) ||
          !c.value()->flush(std::chrono::seconds(30))) {
        std::cerr << "hold_connections: subscribe " << i << " to " << shared << " failed\n";
        return 1;
      }
    }
    clients.push_back(std::move(c.value()));
  }
  std::cout << "held " << clients.size() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  for (auto& c : clients) c->close();
  if (shared != nullptr) {
    std::uint64_t lo = ~0ull, hi = 0;
    for (auto& r : received) {
      lo = std::min<std::uint64_t>(lo, r.load());
      hi = std::max<std::uint64_t>(hi, r.load());
    }
    std::cout << "received " << lo << " " << hi << std::endl;
  }
  return 0;
}
