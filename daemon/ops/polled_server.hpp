// SPDX-License-Identifier: Apache-2.0
// A server of one-request, one-reply clients on a listening socket, driven
// by the main thread's poll() loop (which also handles signals and feeds the
// watchdog, so no client may hold it). Sockets are non-blocking; many clients
// are served side by side; one that sends nothing, too much, or never reads
// its reply is dropped at its deadline or its limit, and the others are not
// kept waiting. The admin socket (line in, JSON out) and the metrics endpoint
// (HTTP GET) are its two protocols.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::daemon {

class PolledServer {
 public:
  struct Protocol {
    std::string name;                          // for logs: "admin", "metrics"
    std::size_t max_request = 4096;            // bytes of a request; more gets too_long's reply
    std::size_t max_clients = 32;              // served at once
    std::chrono::milliseconds deadline{5000};  // from accept to the reply written
    /// When max_clients are connected: drop the oldest client that has not
    /// sent a whole request yet, so that idle sockets cannot lock out a
    /// newcomer (metrics); otherwise the newcomer is told `busy` and closed (admin).
    bool evict_idle_when_full = false;
    /// The reply once `in` holds a whole request; nothing while more is to come.
    std::function<std::optional<std::string>(const std::string& in)> answer;
    std::function<std::string()> too_long;  // reply to a request over max_request
    std::function<std::string()> busy;      // reply to a client over max_clients
  };

  PolledServer(UniqueFd listening, Protocol protocol)
      : listen_(std::move(listening)), protocol_(std::move(protocol)) {}
  PolledServer(const PolledServer&) = delete;
  PolledServer& operator=(const PolledServer&) = delete;

  /// Appends the fds to poll (the listening socket, then each client's).
  void add_poll_fds(std::vector<pollfd>& fds) const;
  /// Handles what poll() found ready among the fds add_poll_fds() appended
  /// (`ready` starts at the first of them), then drops expired clients.
  void on_poll(const pollfd* ready, std::size_t count);
  /// Milliseconds until the next client deadline, or `idle` without clients.
  int timeout_ms(int idle) const;
  std::size_t clients() const { return clients_.size(); }

 private:
  struct Client {
    UniqueFd fd;
    std::string in;
    std::string out;  // the reply, once the request is complete
    std::size_t written = 0;
    std::chrono::steady_clock::time_point deadline;
  };
  void accept_clients();
  /// Reads or writes what it can; false when the client is done (or gone).
  bool serve(Client& c, short revents);

  UniqueFd listen_;
  Protocol protocol_;
  std::vector<Client> clients_;  // oldest first
};

}  // namespace rdmabroker::daemon
