// SPDX-License-Identifier: Apache-2.0
// What tests/bench/login-flood.sh measures a broker against (issue 18,
// docs/security.md "Password guessing and connection floods"): password
// guessers and connections that never log in, all from one address, while a
// legitimate client logs in again and again from another.
//
//   login_flood URL USER PASSWORD LEGIT_BIND FLOOD_BIND GUESSERS HOLDERS LOGINS [SECONDS]
//
// - GUESSERS threads, each connecting as USER with a wrong password (bound to
//   FLOOD_BIND), again 100 ms after each attempt ends;
// - HOLDERS threads, each keeping one connection open that did the
//   transport's handshake and never sends CONNECT (TCP: the 16-byte request;
//   RDMA: an accepted rdma_cm connection), opening another when the broker
//   closes it;
// - LOGINS logins as USER with PASSWORD from LEGIT_BIND, one after the other
//   (100 ms apart), each timed from Client::connect to its return.
// The flood goes on for at least SECONDS (default 0) after its start, so that
// a measurement beside it sees it throughout.
// With GUESSERS = HOLDERS = 0 it measures the quiet figure. Prints one JSON
// object: the logins' percentiles and failures, and the flood's attempts.
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "rdma/harness.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdmabroker::Client;
/// Between a flood thread's attempts (160 guessers and 64 holders at 100 ms: up to 2,240 a second).
constexpr auto kPause = 100ms;
using rdmabroker::ClientOptions;

struct Target {
  bool rdma = false;
  std::string host;
  std::uint16_t port = 0;
};

Target parse(const std::string& url) {
  Target t;
  const auto scheme = url.find("://");
  t.rdma = url.compare(0, scheme, "rdma") == 0;
  const auto rest = url.substr(scheme + 3);
  const auto colon = rest.rfind(':');
  t.host = rest.substr(0, colon);
  t.port = static_cast<std::uint16_t>(std::stoi(rest.substr(colon + 1)));
  return t;
}

/// One TCP connection that does the handshake and then sends nothing; true
/// if the broker accepted it. Returns once the broker closes it or `stop`.
bool hold_tcp(const Target& t, const std::string& bind, const std::atomic<bool>& stop) {
  rdmabroker::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  ::inet_pton(AF_INET, bind.c_str(), &from.sin_addr);
  ::inet_pton(AF_INET, t.host.c_str(), &to.sin_addr);
  to.sin_port = htons(t.port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    return false;
  }
  // Version 3: an accept of 24 bytes, like a reject (version 4's is 32, SPEC.md §2.2).
  const auto request = rdmabroker::proto::encode(rdmabroker::proto::ConnectRequest{16384, 2, 0, 3});
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
    return false;
  std::array<std::byte, rdmabroker::proto::kConnectAcceptSize> reply{};
  std::size_t got = 0;
  bool accepted = false;
  while (!stop) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    std::byte scratch[4096];
    const ssize_t n = ::read(fd.get(), scratch, sizeof scratch);
    if (n <= 0) break;  // the broker closed it (deadline, eviction) or refused it
    for (ssize_t i = 0; i < n && got < reply.size(); ++i) reply[got++] = scratch[i];
    if (got == reply.size() && !accepted) {
      // A reject is padded to an accept's size: a non-zero reason field tells them apart (SPEC.md §1.2).
      rdmabroker::proto::ConnectAccept a;
      accepted = rdmabroker::proto::load<std::uint16_t>(reply.data() + 6) == 0 &&
                 rdmabroker::proto::decode(reply, a) == rdmabroker::proto::HandshakeStatus::kOk;
      if (!accepted) break;
    }
  }
  return accepted;
}

bool hold_rdma(const Target& t, const std::string& bind, const std::atomic<bool>& stop) {
  rdmabroker::test::RawPeer peer;
  auto r = peer.connect(t.host, t.port, bind,
                        rdmabroker::proto::encode(rdmabroker::proto::ConnectRequest{16384, 16}));
  if (!r.ok() || !r->accepted) return false;
  while (!stop && !peer.wait_disconnected(200ms)) {
  }
  return true;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9 && argc != 10) {
    std::cerr
        << "usage: login_flood URL USER PASSWORD LEGIT_BIND FLOOD_BIND GUESSERS HOLDERS LOGINS [SECONDS]\n";
    return 2;
  }
  const std::string url = argv[1], user = argv[2], password = argv[3], legit_bind = argv[4],
                    flood_bind = argv[5];
  const int guessers = std::stoi(argv[6]), holders = std::stoi(argv[7]), logins = std::stoi(argv[8]);
  const Target target = parse(url);
  const auto min_duration = std::chrono::seconds(argc == 10 ? std::stoi(argv[9]) : 0);
  const auto start = Clock::now();

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> guesses{0}, held{0}, hold_refused{0};
  std::vector<std::thread> flood;
  for (int i = 0; i < guessers; ++i) {
    flood.emplace_back([&] {
      ClientOptions opt;
      opt.bind_address = flood_bind;
      opt.user = user;
      opt.password = "not-" + password;
      opt.connect_timeout = 30s;
      opt.recv_credits = 2;
      opt.max_inflight_sends = 1;
      opt.send_queue_buffers = 1;
      while (!stop) {
        auto c = Client::connect(url, opt);
        guesses.fetch_add(1);
        if (c.ok()) {
          std::cerr << "login_flood: a wrong password was accepted\n";
          std::exit(1);
        }
        // Refusals come back in microseconds: without a pause 160 threads
        // would spin on the two cores that the broker and the measured
        // client share, and measure this program's CPU, not the broker.
        std::this_thread::sleep_for(kPause);
      }
    });
  }
  for (int i = 0; i < holders; ++i) {
    flood.emplace_back([&] {
      while (!stop) {
        const bool ok =
            target.rdma ? hold_rdma(target, flood_bind, stop) : hold_tcp(target, flood_bind, stop);
        (ok ? held : hold_refused).fetch_add(1);
        if (!ok) std::this_thread::sleep_for(kPause);  // refused: try again, not in a tight loop
      }
    });
  }
  if (guessers + holders > 0) std::this_thread::sleep_for(3s);  // the flood reaches its steady state

  ClientOptions opt;
  opt.bind_address = legit_bind;
  opt.user = user;
  opt.password = password;
  opt.connect_timeout = 30s;
  std::vector<double> ms;
  int failures = 0;
  std::string first_error;
  const auto flood_start = Clock::now();
  for (int i = 0; i < logins; ++i) {
    const auto t0 = Clock::now();
    auto c = Client::connect(url, opt);
    const auto t1 = Clock::now();
    if (c.ok()) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    } else {
      ++failures;
      if (first_error.empty()) {
        first_error = c.error().message;
        std::replace(first_error.begin(), first_error.end(), '"', '\'');  // stays one JSON string
      }
    }
    std::this_thread::sleep_for(100ms);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - flood_start).count();
  std::this_thread::sleep_until(start + min_duration);
  stop = true;
  for (auto& t : flood) t.join();
  std::printf(
      "{\"logins\": %zu, \"login_failures\": %d, \"login_p50_ms\": %.1f, \"login_p99_ms\": %.1f, "
      "\"login_max_ms\": %.1f, \"seconds\": %.1f, \"guess_attempts\": %llu, \"held\": %llu, "
      "\"hold_refused\": %llu, \"first_error\": \"%s\"}\n",
      ms.size(), failures, percentile(ms, 0.5), percentile(ms, 0.99),
      ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()), seconds,
      static_cast<unsigned long long>(guesses.load()), static_cast<unsigned long long>(held.load()),
      static_cast<unsigned long long>(hold_refused.load()), first_error.c_str());
  return failures == 0 ? 0 : 1;
}
