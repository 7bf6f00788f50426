// The local admin socket (Unix stream socket). A client writes one command
// line and reads one JSON reply; the connection then closes. Commands:
//   stats   -> {"ok":true,"stats":{name:value,...}}
// Anything else -> {"ok":false,"error":"..."}. Served on the main thread.
#pragma once

#include <functional>
#include <string>

#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class AdminServer {
 public:
  using Handler = std::function<std::string(const std::string& command)>;

  AdminServer(std::string path, Handler handler) : path_(std::move(path)), handler_(std::move(handler)) {}
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  Status open();
  int fd() const { return listen_.get(); }
  /// Accepts and answers one pending client (the fd is readable).
  void serve_one();

 private:
  std::string path_;
  Handler handler_;
  UniqueFd listen_;
};

}  // namespace rdmabroker::daemon
