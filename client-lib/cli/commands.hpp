// SPDX-License-Identifier: Apache-2.0
// What the rdmabroker CLI's subcommands share (main.cpp: pub, sub, request,
// reply; bench_command.cpp; admin_commands.cpp: stat, reload, passwd): the
// exit codes (main.cpp's opening comment lists them), the connection
// options every client subcommand takes, and connecting or failing with
// the right code.
#pragma once

#include <sysexits.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rdmabroker/client.hpp"

namespace rdmabroker::cli {

using rdmabroker::Client;
using rdmabroker::ClientOptions;

inline constexpr int kExitFailed = 1;
inline constexpr int kExitTimeout = 3;
inline constexpr int kExitNoResponders = 4;
inline constexpr int kExitUsage = EX_USAGE;              // 64
inline constexpr int kExitNoInput = EX_NOINPUT;          // 66
inline constexpr int kExitUnavailable = EX_UNAVAILABLE;  // 69
inline constexpr int kExitRefused = EX_NOPERM;           // 77

/// SIGINT or SIGTERM arrived: long-running subcommands end cleanly.
extern std::atomic<bool> g_interrupted;
/// The broker refused something for permissions (ERROR PERMISSION_DENIED, an
/// asynchronous report): the command exits kExitRefused, not 0 or 1.
extern std::atomic<bool> g_refused;

struct Common {
  std::string server;
  std::string bind;
  std::string user;
  std::string password;
  std::string token;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  bool reconnect = false;
  bool verbose = false;

  /// The credentials and TLS files given by flag or environment (docs/security.md).
  void set_credentials(ClientOptions& opt) const {
    opt.user = user;
    opt.password = password;
    opt.token = token;
    opt.tls_ca_file = tls_ca;
    opt.tls_cert_file = tls_cert;
    opt.tls_key_file = tls_key;
  }
};

/// The URL to connect to: the one given (--server, RDMABROKER_URL) as it is;
/// else the default, over TCP on a host without RDMA devices.
std::string server_url(const Common& c);
/// Registers the connection options (--server, credentials, TLS files, --reconnect, -v) on `cmd`.
void add_common(CLI::App* cmd, Common& c);
/// The exit code of a connection that failed: the URL was unusable (usage),
/// the broker refused the credentials (permission), or it cannot be reached
/// or refused the connection (unavailable).
int connect_exit_code(const rdmabroker::Error& e);
/// A client connected as `c` says, or the process exits with the reason and its code.
std::unique_ptr<Client> connect_or_die(const Common& c);
/// Says why and gives the exit code: refused if the broker refused
/// something meanwhile (that is why a subscription ended or a request went
/// unanswered), else failed.
int die(const rdmabroker::Error& e);
/// An admin command's failure: no connection to the socket is unavailable,
/// like a broker that cannot be reached; anything else failed.
int die_admin(const rdmabroker::Error& e);
/// After a flush: the broker has answered everything sent before it, its
/// refusals included (reported through on_error before the flush returns).
int refused_or(int code);
/// Connects, subscribes (in queue group `queue`, if any) and waits until the
/// broker has the subscription; exits with a message on failure.
std::pair<std::unique_ptr<Client>, std::shared_ptr<rdmabroker::Subscription>> subscribe_or_die(
    const Common& common, const std::string& subject, const std::string& queue);
/// --header NAME=VALUE options as message headers; exits with a usage error on one without '='.
rdmabroker::Headers headers_or_die(const std::vector<std::string>& options);

/// A subcommand: its options are registered on the app; `run` is called when
/// it is the one parsed. The option values live in the closure's state.
struct Subcommand {
  CLI::App* cmd;
  std::function<int()> run;
};

Subcommand add_bench(CLI::App& app);
Subcommand add_consume(CLI::App& app);
Subcommand add_stream(CLI::App& app);
Subcommand add_stat(CLI::App& app);
Subcommand add_reload(CLI::App& app);
Subcommand add_passwd(CLI::App& app);

}  // namespace rdmabroker::cli
