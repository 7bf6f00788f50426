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
#include <string>
#include <vector>

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
    std::string out;  // the reply, once the command line is complete
    std::size_t written = 0;
    std::chrono::steady_clock::time_point deadline;
  };
  void accept_clients();
  /// Reads or writes what it can; false when the client is done (or gone).
  bool serve(Client& c, short revents);
  void answer(Client& c, const std::string& command);
  static std::string error_reply(const std::string& message);

  std::string path_;
  Handler handler_;
  UniqueFd listen_;
  std::vector<Client> clients_;
};

}  // namespace rdmabroker::daemon
