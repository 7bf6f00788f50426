// SPDX-License-Identifier: Apache-2.0
// The CLI's shared pieces (commands.hpp): connection options, the default
// URL, connecting and failing with the right exit code.
#include <filesystem>
#include <iostream>
#include <string>

#include "commands.hpp"

namespace rdmabroker::cli {

std::atomic<bool> g_interrupted{false};
std::atomic<bool> g_refused{false};

namespace {

constexpr const char* kDefaultServer = "rdma://localhost:7470";
/// Where the default goes on a host without RDMA (rdmabrokerd there serves TCP only).
constexpr const char* kDefaultServerWithoutRdma = "tcp://localhost:7471";

/// RDMABROKER_URL, or nullptr.
const char* env_server() { return std::getenv("RDMABROKER_URL"); }

/// Whether the kernel has any RDMA device (verbs devices are listed in
/// /sys/class/infiniband, Soft-RoCE's too). RDMABROKER_SYSFS_INFINIBAND names
/// another directory, for the test of a host without RDMA.
bool host_has_rdma_device() {
  const char* dir = std::getenv("RDMABROKER_SYSFS_INFINIBAND");
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir != nullptr ? dir : "/sys/class/infiniband", ec)) {
    (void)entry;
    return true;
  }
  return false;
}

}  // namespace

std::string server_url(const Common& c) {
  if (!c.server.empty()) return c.server;
  if (const char* env = env_server()) return env;
  if (host_has_rdma_device()) return kDefaultServer;
  if (c.verbose) std::cerr << "no RDMA device on this host: using " << kDefaultServerWithoutRdma << "\n";
  return kDefaultServerWithoutRdma;
}

void add_common(CLI::App* cmd, Common& c) {
  cmd->add_option("-s,--server", c.server,
                  "Broker URL: rdma://, tcp:// or tls://host[:port] (env RDMABROKER_URL)")
      ->default_str(env_server() != nullptr ? env_server()
                                            : std::string(kDefaultServer) + "; without RDMA devices " +
                                                  kDefaultServerWithoutRdma);
  cmd->add_option("-b,--bind", c.bind, "Local address to bind (selects the RDMA device)");
  cmd->add_option("-u,--user", c.user, "User name (env RDMABROKER_USER)")->envname("RDMABROKER_USER");
  cmd->add_option("--password", c.password,
                  "Password; prefer the environment, which ps does not show (env RDMABROKER_PASSWORD)")
      ->envname("RDMABROKER_PASSWORD");
  cmd->add_option("--token", c.token, "Token instead of user and password (env RDMABROKER_TOKEN)")
      ->envname("RDMABROKER_TOKEN");
  cmd->add_option("--tls-ca", c.tls_ca,
                  "tls://: CA certificates (PEM) the broker's certificate must chain to; default: the "
                  "system's (env RDMABROKER_TLS_CA)")
      ->envname("RDMABROKER_TLS_CA");
  cmd->add_option("--tls-cert", c.tls_cert,
                  "tls://: this client's certificate (PEM), for a broker that asks for one (env "
                  "RDMABROKER_TLS_CERT)")
      ->envname("RDMABROKER_TLS_CERT");
  cmd->add_option("--tls-key", c.tls_key,
                  "tls://: the private key of --tls-cert (PEM) (env RDMABROKER_TLS_KEY)")
      ->envname("RDMABROKER_TLS_KEY");
  cmd->add_flag("--reconnect", c.reconnect,
                "Reconnect (with backoff) when the connection fails or the broker restarts");
  cmd->add_flag("-v,--verbose", c.verbose, "Say which transport and device are used");
}

int connect_exit_code(const rdmabroker::Error& e) {
  switch (e.kind) {
    case rdmabroker::ErrorKind::kInvalidArgument:
      return kExitUsage;
    case rdmabroker::ErrorKind::kAuthenticationFailed:
    case rdmabroker::ErrorKind::kPermissionDenied:
      return kExitRefused;
    default:
      return kExitUnavailable;
  }
}

std::unique_ptr<Client> connect_or_die(const Common& c) {
  ClientOptions opt;
  opt.bind_address = c.bind;
  c.set_credentials(opt);
  opt.reconnect = c.reconnect;
  opt.on_connection_event = [](const rdmabroker::ConnectionEvent& e) {
    using K = rdmabroker::ConnectionEvent::Kind;
    if (e.kind == K::kDisconnected)
      std::cerr << "rdmabroker: disconnected (" << e.reason.message << "), reconnecting\n";
    if (e.kind == K::kReconnected) {
      std::cerr << "rdmabroker: reconnected after " << e.downtime.count() << " ms (" << e.attempts
                << " attempts); messages published meanwhile were missed\n";
    }
    if (e.kind == K::kGaveUp) std::cerr << "rdmabroker: " << e.reason.message << "\n";
  };
  opt.on_error = [](const rdmabroker::Error& e) {
    if (e.kind == rdmabroker::ErrorKind::kPermissionDenied) g_refused = true;
    std::cerr << "rdmabroker: " << e.message << "\n";
  };
  auto client = Client::connect(server_url(c), opt);
  if (!client) {
    std::cerr << "rdmabroker: " << client.error().message << "\n";
    std::exit(connect_exit_code(client.error()));
  }
  if (c.verbose) std::cerr << "connected: " << client.value()->transport_description() << "\n";
  return std::move(client.value());
}

int die(const rdmabroker::Error& e) {
  std::cerr << "rdmabroker: " << e.message << "\n";
  return g_refused ? kExitRefused : kExitFailed;
}

int die_admin(const rdmabroker::Error& e) {
  std::cerr << "rdmabroker: " << e.message << "\n";
  return e.kind == rdmabroker::ErrorKind::kConnectFailed ? kExitUnavailable : kExitFailed;
}

int refused_or(int code) { return g_refused ? kExitRefused : code; }

std::pair<std::unique_ptr<Client>, std::shared_ptr<rdmabroker::Subscription>> subscribe_or_die(
    const Common& common, const std::string& subject, const std::string& queue) {
  auto client = connect_or_die(common);
  auto sub = client->queue_subscribe(std::string_view(subject), queue);
  if (!sub) std::exit(die(sub.error()));
  if (auto st = client->flush(std::chrono::seconds(30)); !st) std::exit(die(st.error()));
  if (g_refused) std::exit(kExitRefused);  // the subscription was refused (on_error said why)
  return {std::move(client), std::move(sub.value())};
}

rdmabroker::Headers headers_or_die(const std::vector<std::string>& options) {
  rdmabroker::Headers headers;
  for (const auto& o : options) {
    const auto eq = o.find('=');
    if (eq == std::string::npos) {
      std::cerr << "rdmabroker: --header " << o << ": expected NAME=VALUE\n";
      std::exit(kExitUsage);
    }
    headers.add(std::string_view(o).substr(0, eq), std::string_view(o).substr(eq + 1));
  }
  return headers;
}

}  // namespace rdmabroker::cli
