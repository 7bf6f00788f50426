// SPDX-License-Identifier: Apache-2.0
// The local admin socket (Unix stream socket). A client writes one command
// line and reads one JSON reply; the connection then closes. Commands:
//   stats   -> {"ok":true,"stats":{name:value,...}}
// Anything else -> {"ok":false,"error":"..."}. Served on the main thread,
// which also handles signals and feeds the watchdog: so no client may hold
// it. Sockets are non-blocking and many clients are served side by side;
// one that sends nothing, too much, or never reads its reply is dropped at
// its deadline or its limit, and the others are not kept waiting.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/polled_server.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class AdminServer {
 public:
  using Handler = std::function<std::string(const std::string& command)>;
  /// A command line longer than this is refused with an error.
  static constexpr std::size_t kMaxLine = 4096;
  /// Clients served at once; more are told to come back later.
  static constexpr std::size_t kMaxClients = 32;
  /// From accept to the reply written.
  static constexpr std::chrono::seconds kClientDeadline{5};

  AdminServer(std::string path, Handler handler) : path_(std::move(path)), handler_(std::move(handler)) {}
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  Status open();
  void add_poll_fds(std::vector<pollfd>& fds) const { server_->add_poll_fds(fds); }
  void on_poll(const pollfd* ready, std::size_t count) { server_->on_poll(ready, count); }
  int timeout_ms(int idle) const { return server_->timeout_ms(idle); }
  std::size_t clients() const { return server_->clients(); }

 private:
  std::optional<std::string> answer(const std::string& in) const;
  static std::string error_reply(const std::string& message);
  static std::string too_long_reply();
  /// The socket's directory lets no other user replace it (not writable by all, or sticky).
  Status check_directory() const;

  std::string path_;
  Handler handler_;
  std::unique_ptr<PolledServer> server_;
};

}  // namespace rdmabroker::daemon
