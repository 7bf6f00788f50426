// SPDX-License-Identifier: Apache-2.0
// How fast clients connect: N librdmabroker clients, connected one after the
// other by each of T threads and held until all are up, then closed. Prints
// one line per run, e.g.
//   connect_rate: 200 connections, 1 thread(s): 12.3 s, 16.3 connects/s,
//   per connect p50 58.1 ms p99 90.2 ms max 120.0 ms (p50 of the first tenth
//   55.0 ms, of the last 60.2 ms); close 1.2 s
// tests/bench/connect-rate.sh runs it against the broker and compares with a
// raw rdma_cm loop (rdma-core's ucmatose) in the same guest boot.
//   connect_rate URL N [BIND] [THREADS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmabroker/client.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: connect_rate URL N [BIND] [THREADS]\n";
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const std::string url = argv[1];
  const int n = std::stoi(argv[2]);
  const std::string bind = argc > 3 ? argv[3] : "";
  const int threads = argc > 4 ? std::max(1, std::stoi(argv[4])) : 1;
  rdmabroker::ClientOptions opt;
  opt.bind_address = bind;
  // What tests/bench/hold_connections.cpp uses: the smallest client, so the
  // broker's own cost per connection is what is measured.
  opt.recv_credits = 4;  // the fewest with credits by demand (SPEC.md §5.1)
  opt.max_inflight_sends = 1;
  opt.send_queue_buffers = 1;
  opt.connect_timeout = std::chrono::seconds(60);

  std::mutex mu;
  std::vector<double> ms;
  std::vector<double> in_order(static_cast<std::size_t>(n));  // by connection number: does it slow with N?
  std::vector<std::unique_ptr<rdmabroker::Client>> clients;
  std::string failure;
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = t; i < n; i += threads) {
        const auto start = Clock::now();
        auto c = rdmabroker::Client::connect(url, opt);
        const double took = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        std::lock_guard lock(mu);
        if (!c) {
          if (failure.empty()) failure = "connection " + std::to_string(i) + ": " + c.error().message;
          return;
        }
        ms.push_back(took);
        in_order[static_cast<std::size_t>(i)] = took;
        clients.push_back(std::move(c.value()));
      }
    });
  }
  for (auto& w : workers) w.join();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!failure.empty()) {
    std::cerr << "connect_rate: " << failure << "\n";
    return 1;
  }
  const auto c0 = Clock::now();
  clients.clear();
  const double close_s = std::chrono::duration<double>(Clock::now() - c0).count();
  // The median connect among the first and the last tenth: a cost that grows
  // with the number of connections shows here.
  auto tenth_p50 = [&](std::size_t from) {
    const std::size_t len = std::max<std::size_t>(1, in_order.size() / 10);
    std::vector<double> part(
        in_order.begin() + static_cast<std::ptrdiff_t>(from),
        in_order.begin() + static_cast<std::ptrdiff_t>(std::min(from + len, in_order.size())));
    std::sort(part.begin(), part.end());
    return part[part.size() / 2];
  };
  const double first_tenth = tenth_p50(0);
  const double last_tenth = tenth_p50(in_order.size() - std::max<std::size_t>(1, in_order.size() / 10));
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(p * ms.size()))]; };
  std::printf(
      "connect_rate: %d connections, %d thread(s): %.1f s, %.1f connects/s, per connect p50 %.1f ms p99 %.1f "
      "ms max %.1f ms (p50 of the first tenth %.1f ms, of the last %.1f ms); close %.1f s\n",
      n, threads, total, n / total, pct(0.50), pct(0.99), ms.back(), first_tenth, last_tenth, close_s);
  return 0;
}
