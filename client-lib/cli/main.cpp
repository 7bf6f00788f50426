// SPDX-License-Identifier: Apache-2.0
// rdmabroker: command-line client built on librdmabroker.
//   rdmabroker pub SUBJECT [MESSAGE|-]   publish (a message, or each line of stdin)
//   rdmabroker pub SUBJECT --file F|-    publish a file (or all of stdin) as one message
//   rdmabroker sub SUBJECT [--count N] [--queue GROUP]
//                                        print messages as they arrive (wildcards allowed)
//   rdmabroker request SUBJECT MESSAGE   send a request, print the first reply
//   rdmabroker reply SUBJECT MESSAGE     answer every request on SUBJECT with MESSAGE
//   rdmabroker stat [--json]             the broker's counters and connections (admin socket)
//   rdmabroker reload                    reload the broker's configuration (admin socket)
//   rdmabroker bench [SUBJECT]           N publishers -> M subscribers: rates, loss, latency
// The broker URL is rdma://host[:port], tcp://host[:port] or tls://host[:port]
// (--server, or RDMABROKER_URL). With neither, rdma://localhost:7470, or
// tcp://localhost:7471 on a host without RDMA devices (a URL the user gave is
// never changed).
//
// Exit codes, the same for every subcommand (docs/cli.md; sysexits(3) where
// one fits):
//   0  done
//   1  failed (the connection was lost, the broker sent an error, a bad subject...)
//   3  timed out (sub --timeout, request --timeout)
//   4  no responders (request)
//   64 usage error (EX_USAGE)
//   66 the --file cannot be read (EX_NOINPUT)
//   69 the broker (or its admin socket) cannot be reached or refused the connection (EX_UNAVAILABLE)
//   77 credentials or permission refused by the broker (EX_NOPERM)
#include <crypt.h>
#include <sysexits.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "admin_client.hpp"
#include "bench.hpp"
#include "rdmabroker/client.hpp"

namespace {

using rdmabroker::Client;
using rdmabroker::ClientOptions;

std::atomic<bool> g_interrupted{false};
/// The broker refused something for permissions (ERROR PERMISSION_DENIED, an
/// asynchronous report): the command exits kExitRefused, not 0 or 1.
std::atomic<bool> g_refused{false};

constexpr int kExitFailed = 1;
constexpr int kExitTimeout = 3;
constexpr int kExitNoResponders = 4;
constexpr int kExitUsage = EX_USAGE;              // 64
constexpr int kExitNoInput = EX_NOINPUT;          // 66
constexpr int kExitUnavailable = EX_UNAVAILABLE;  // 69
constexpr int kExitRefused = EX_NOPERM;           // 77

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

/// The URL to connect to: the one given (--server, RDMABROKER_URL) as it is;
/// else the default, over TCP on a host without RDMA devices.
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

/// `rdmabroker passwd`: the crypt(3) hash of a password or token for the
/// broker's auth.users (yescrypt unless asked otherwise); the secret is read
/// from stdin so that it is not in the shell history or the process list.
int run_passwd(const std::string& scheme, unsigned long cost) {
  std::string secret;
  std::getline(std::cin, secret);
  if (secret.empty()) {
    std::cerr << "rdmabroker passwd: read an empty secret from stdin\n";
    return kExitUsage;
  }
  const char* prefix = scheme == "yescrypt"      ? "$y$"
                       : scheme == "sha512crypt" ? "$6$"
                       : scheme == "bcrypt"      ? "$2b$"
                                                 : nullptr;
  if (prefix == nullptr) {
    std::cerr << "rdmabroker passwd: unknown scheme '" << scheme << "' (yescrypt, sha512crypt, bcrypt)\n";
    return kExitUsage;
  }
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  if (crypt_gensalt_rn(prefix, cost, nullptr, 0, setting, sizeof setting) == nullptr) {
    std::cerr << "rdmabroker passwd: crypt_gensalt: " << std::strerror(errno) << "\n";
    return kExitFailed;
  }
  crypt_data data{};
  const char* hash = crypt_r(secret.c_str(), setting, &data);
  explicit_bzero(secret.data(), secret.size());
  if (hash == nullptr || hash[0] == '*') {
    std::cerr << "rdmabroker passwd: crypt failed\n";
    return kExitFailed;
  }
  std::cout << hash << "\n";
  explicit_bzero(&data, sizeof data);
  return 0;
}

/// The exit code of a connection that failed: the URL was unusable (usage),
/// the broker refused the credentials (permission), or it cannot be reached
/// or refused the connection (unavailable).
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

/// Says why and gives the exit code: refused if the broker refused
/// something meanwhile (that is why a subscription ended or a request went
/// unanswered), else failed.
int die(const rdmabroker::Error& e) {
  std::cerr << "rdmabroker: " << e.message << "\n";
  return g_refused ? kExitRefused : kExitFailed;
}

/// An admin command's failure: no connection to the socket is unavailable,
/// like a broker that cannot be reached; anything else failed.
int die_admin(const rdmabroker::Error& e) {
  std::cerr << "rdmabroker: " << e.message << "\n";
  return e.kind == rdmabroker::ErrorKind::kConnectFailed ? kExitUnavailable : kExitFailed;
}

/// After a flush: the broker has answered everything sent before it, its
/// refusals included (reported through on_error before the flush returns).
int refused_or(int code) { return g_refused ? kExitRefused : code; }

/// Connects, subscribes (in queue group `queue`, if any) and waits until the
/// broker has the subscription; exits with a message on failure.
std::pair<std::unique_ptr<Client>, std::shared_ptr<rdmabroker::Subscription>> subscribe_or_die(
    const Common& common, const std::string& subject, const std::string& queue) {
  auto client = connect_or_die(common);
  auto sub = client->queue_subscribe(std::string_view(subject), queue);
  if (!sub) std::exit(die(sub.error()));
  if (auto st = client->flush(std::chrono::seconds(30)); !st) std::exit(die(st.error()));
  if (g_refused) std::exit(kExitRefused);  // the subscription was refused (on_error said why)
  return {std::move(client), std::move(sub.value())};
}

/// How `rdmabroker bench` uses the library beyond its ClientOptions.
struct EndpointMode {
  bool copy = false;  // subscribers take owning Messages (--copy)
  /// --polled: ClientOptions::polled. A subscriber is driven by a thread of
  /// the bench that calls poll(poll_timeout) (0: spins) until the end; a
  /// publisher polls once after each publish, on its own thread (credits
  /// and errors come in there), as a polled application's loop would.
  bool polled = false;
  std::chrono::microseconds poll_timeout{0};
};

/// `rdmabroker bench`'s connection: one librdmabroker client.
class BrokerEndpoint final : public rdmabroker::bench::BenchEndpoint {
 public:
  static std::unique_ptr<BenchEndpoint> connect(const std::string& url, const std::string& bind,
                                                const ClientOptions& base, const rdmabroker::Headers& headers,
                                                const EndpointMode& mode, std::string& error) {
    ClientOptions co = base;
    co.polled = mode.polled;
    co.bind_address = bind;
    co.publish_timeout = std::chrono::seconds(30);
    co.connect_timeout = std::chrono::seconds(15);
    auto c = Client::connect(url, co);
    if (!c) {
      error = c.error().message;
      return nullptr;
    }
    return std::unique_ptr<BenchEndpoint>(new BrokerEndpoint(std::move(c.value()), headers, mode));
  }
  std::string subscribe(const std::string& subject, const std::string& queue, OnPayload on_payload) override {
    // In place, the bench reads the payload and copies nothing; --copy: as
    // an owning Message.
    auto sid = mode_.copy
                   ? client_->queue_subscribe(subject, queue,
                                              [f = on_payload](const rdmabroker::Message& m) {
                                                f(rdmabroker::bench::Received(m.payload));
                                              })
                   : client_->queue_subscribe_view(
                         subject, queue, [f = on_payload](const rdmabroker::MessageView& m) {
                           f(rdmabroker::bench::Received(m.payload, m.received_at.time_since_epoch().count(),
                                                         m.relay_time.count()));
                         });
    if (!sid) return sid.error().message;
    start_polling();
    return flush(std::chrono::seconds(30));
  }
  std::string publish(const std::string& subject, std::span<const std::byte> payload, bool) override {
    // The library coalesces on its own: whatever is queued while a send is
    // in flight goes out together, an idle connection sends at once.
    auto st =
        headers_.empty() ? client_->publish(subject, payload) : client_->publish(subject, headers_, payload);
    if (!st) return st.error().message;
    if (mode_.polled && !poller_.joinable()) {
      if (auto polled = client_->poll(); !polled) return polled.error().message;
    }
    return {};
  }
  std::string flush(std::chrono::milliseconds timeout) override {
    auto st = client_->flush(timeout);
    return st ? std::string() : st.error().message;
  }
  std::string close() override {
    stop_polling();
    std::string why = client_->close_reason().message;
    client_->close();
    return why;
  }
  ~BrokerEndpoint() override { stop_polling(); }
  std::string describe() const override { return client_->transport_description(); }
  std::optional<std::uint64_t> wakeups() const override {
    const auto s = client_->stats();
    return s.io_wakeups + s.app_wakeups;
  }

 private:
  BrokerEndpoint(std::unique_ptr<Client> c, rdmabroker::Headers headers, const EndpointMode& mode)
      : client_(std::move(c)), headers_(std::move(headers)), mode_(mode) {}
  void start_polling() {
    if (!mode_.polled || poller_.joinable()) return;
    poller_ = std::thread([this] {
      // Until close(), or until the connection ends (the bench then sees its
      // messages missing and the close reason).
      while (!stop_polling_.load(std::memory_order_relaxed) && client_->poll(mode_.poll_timeout)) {
      }
    });
  }
  void stop_polling() {
    if (!poller_.joinable()) return;
    stop_polling_ = true;
    poller_.join();
  }
  std::unique_ptr<Client> client_;
  const rdmabroker::Headers headers_;  // on every message published (bench --header)
  const EndpointMode mode_;
  std::atomic<bool> stop_polling_{false};
  std::thread poller_;  // --polled: the thread that drives client_
};

/// --header NAME=VALUE options as message headers; exits with a usage error on one without '='.
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

/// The message line `sub` prints, then its headers, one "  Name: value" line each.
void print_message(std::uint64_t n, const rdmabroker::Message& m) {
  std::cout << "[#" << n << "] " << m.subject << ": " << m.data() << "\n";
  for (const auto& [name, value] : m.headers) std::cout << "  " << name << ": " << value << "\n";
}

int run_pub(const Common& common, const std::string& subject, const std::string& message, std::uint64_t count,
            const std::vector<std::string>& header_options, const std::string& file) {
  const rdmabroker::Headers headers = headers_or_die(header_options);
  std::string contents;  // --file: the whole file (or stdin) as one message, bytes as they are
  if (!file.empty()) {
    if (file == "-") {
      contents.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      int err = 0;
      std::error_code ec;
      if (std::filesystem::is_directory(file, ec)) {
        err = EISDIR;
      } else {
        errno = 0;
        std::ifstream in(file, std::ios::binary);
        if (in) {
          contents.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        } else {
          err = errno != 0 ? errno : ENOENT;
        }
      }
      if (err != 0) {
        std::cerr << "rdmabroker: --file " << file << ": " << std::strerror(err) << "\n";
        return kExitNoInput;
      }
    }
  }
  auto client = connect_or_die(common);
  auto publish = [&](std::string_view payload) {
    return headers.empty() ? client->publish(subject, payload) : client->publish(subject, headers, payload);
  };
  std::uint64_t sent = 0;
  if (!file.empty()) {
    for (std::uint64_t i = 0; i < count && !g_interrupted; ++i) {
      if (auto st = publish(contents); !st) return die(st.error());
      ++sent;
    }
  } else if (message == "-") {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (auto st = publish(line); !st) return die(st.error());
      ++sent;
    }
  } else {
    for (std::uint64_t i = 0; i < count && !g_interrupted; ++i) {
      if (auto st = publish(message); !st) return die(st.error());
      ++sent;
    }
  }
  // flush: the broker has routed every message once this returns.
  if (auto st = client->flush(std::chrono::seconds(30)); !st) return die(st.error());
  if (common.verbose) std::cerr << "published " << sent << " message(s) to " << subject << "\n";
  client->close();
  return refused_or(0);
}

int run_sub(const Common& common, const std::string& subject, const std::string& queue, std::uint64_t count,
            bool raw, double timeout_s) {
  auto [client, sub] = subscribe_or_die(common, subject, queue);
  // Scripts wait for this line to know the subscription is active.
  std::cerr << "subscribed to " << subject << (queue.empty() ? "" : " in queue group " + queue) << "\n";
  std::uint64_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while ((count == 0 || got < count) && !g_interrupted) {
    if (timeout_s > 0 && std::chrono::steady_clock::now() >= deadline) {
      std::cerr << "rdmabroker: timed out after " << got << " message(s)\n";
      return kExitTimeout;
    }
    auto m = sub->next(std::chrono::milliseconds(200));
    if (!m) {
      if (m.error().kind == rdmabroker::ErrorKind::kTimeout) continue;
      return die(m.error());
    }
    ++got;
    if (raw) {
      std::cout << m->data() << "\n";
    } else {
      print_message(got, *m);
    }
    std::cout.flush();
  }
  client->close();
  return 0;
}

int run_request(const Common& common, const std::string& subject, const std::string& message,
                double timeout_s, const std::vector<std::string>& header_options) {
  const rdmabroker::Headers headers = headers_or_die(header_options);
  auto client = connect_or_die(common);
  auto reply = client->request(
      subject, headers, rdmabroker::as_payload(message),
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s)));
  if (!reply) {
    // A refusal of the request's reply subscription comes as an ERROR that
    // the library reports after it woke the request with NO_RESPONDERS:
    // once a flush returns, every report of what came before it is in.
    (void)client->flush(std::chrono::seconds(5));
    // Distinct exit codes: scripts tell "nobody serves this" from "too slow"
    // and from "not allowed" (a refused request goes unanswered).
    const int code = reply.error().kind == rdmabroker::ErrorKind::kNoResponders ? kExitNoResponders
                     : reply.error().kind == rdmabroker::ErrorKind::kTimeout    ? kExitTimeout
                                                                                : kExitFailed;
    std::cerr << "rdmabroker: " << reply.error().message << "\n";
    return refused_or(code);
  }
  std::cout << reply->data() << "\n";
  client->close();
  return 0;
}

int run_reply(const Common& common, const std::string& subject, const std::string& queue,
              const std::string& message, std::uint64_t count) {
  auto [client, sub] = subscribe_or_die(common, subject, queue);
  std::cerr << "replying on " << subject << (queue.empty() ? "" : " in queue group " + queue) << "\n";
  std::uint64_t answered = 0;
  while ((count == 0 || answered < count) && !g_interrupted) {
    auto m = sub->next(std::chrono::milliseconds(200));
    if (!m) {
      if (m.error().kind == rdmabroker::ErrorKind::kTimeout) continue;
      return die(m.error());
    }
    if (m->reply.empty()) continue;  // a plain publish: nobody to answer
    if (auto st = client->publish(m->reply, message); !st) return die(st.error());
    ++answered;
    if (common.verbose) std::cerr << "answered " << m->subject << " -> " << m->reply << "\n";
  }
  if (auto st = client->flush(std::chrono::seconds(30)); !st) return die(st.error());
  client->close();
  return refused_or(0);
}

int run_stat(const std::string& socket, bool json) {
  auto stats = rdmabroker::cli::admin_command(socket, "stats");
  if (!stats) return die_admin(stats.error());
  auto conns = rdmabroker::cli::admin_command(socket, "connections");
  if (!conns) return die_admin(conns.error());
  if (!stats.value().value("ok", false) || !conns.value().value("ok", false)) {
    std::cerr << "rdmabroker: " << stats.value().dump() << "\n";
    return kExitFailed;
  }
  const auto& s = stats.value()["stats"];
  const auto& c = conns.value()["connections"];
  const nlohmann::json cfg = stats.value().value("config", nlohmann::json::object());
  const nlohmann::json routes = stats.value().value("routes", nlohmann::json::array());
  if (json) {
    std::cout << nlohmann::json{{"config", cfg}, {"stats", s}, {"connections", c}, {"routes", routes}}.dump(2)
              << "\n";
    return 0;
  }
  // Where the broker listens and why: the file, a flag or a default (docs/configuration.md, "Precedence").
  if (cfg.contains("file")) std::cout << "config file: " << cfg["file"].get<std::string>() << "\n";
  for (const auto& l : cfg.value("listeners", nlohmann::json::array()))
    std::cout << l.get<std::string>() << "\n";
  if (!cfg.empty()) std::cout << "\n";
  for (const auto& [k, v] : s.items()) std::cout << k << " " << v << "\n";
  std::cout << "\nrates (last ~5 s): " << s.value("rates.messages_in_per_s", 0) << " msg/s in, "
            << s.value("rates.messages_out_per_s", 0) << " msg/s out, " << s.value("rates.bytes_in_per_s", 0)
            << " B/s in, " << s.value("rates.bytes_out_per_s", 0) << " B/s out\n";
  std::cout << c.size() << " connection(s)\n";
  if (!c.empty()) {
    std::printf("%-6s %-5s %2s %-22s %-13s %-12s %4s %12s %12s %14s %14s %8s\n", "id", "via", "v", "peer",
                "state", "user", "subs", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "pending");
  }
  for (const auto& x : c) {
    std::printf("%-6llu %-5s %2u %-22s %-13s %-12s %4llu %12llu %12llu %14llu %14llu %8llu\n",
                static_cast<unsigned long long>(x.value("id", 0ull)), x.value("transport", "").c_str(),
                x.value("version", 0u), x.value("peer", "").c_str(), x.value("state", "").c_str(),
                x.value("user", "-").c_str(), static_cast<unsigned long long>(x.value("subscriptions", 0ull)),
                static_cast<unsigned long long>(x.value("messages_in", 0ull)),
                static_cast<unsigned long long>(x.value("messages_out", 0ull)),
                static_cast<unsigned long long>(x.value("bytes_in", 0ull)),
                static_cast<unsigned long long>(x.value("bytes_out", 0ull)),
                static_cast<unsigned long long>(x.value("pending_messages", 0ull)));
  }
  // A broker of a cluster (docs/cluster.md): one row per other broker, both
  // ways. Its route there (the broker's id from that broker's INFO) says
  // what it brought; that broker's route here (a connection naming the same
  // broker) what was sent to it.
  std::map<std::string, nlohmann::json> inbound;  // by broker id
  for (const auto& x : c)
    if (!x.value("broker", "").empty()) inbound[x["broker"].get<std::string>()] = x;
  const auto u64 = [](const nlohmann::json& j, const char* key) {
    return static_cast<unsigned long long>(j.value(key, 0ull));
  };
  if (!routes.empty()) {
    std::cout << "\n" << routes.size() << " route(s)\n";
    std::printf("%-32s %-10s %-16s %-6s %8s %12s %14s %12s %14s %8s %10s\n", "route", "state", "broker",
                "from", "interest", "msgs_in", "bytes_in", "msgs_out", "bytes_out", "dropped", "reconnects");
  }
  for (const auto& r : routes) {
    // "from": cluster.routes ("config"), or announced by another broker ("gossip").
    const std::string broker = r.value("broker", "");
    nlohmann::json back = nlohmann::json::object();
    if (auto it = inbound.find(broker); !broker.empty() && it != inbound.end()) {
      back = it->second;
      inbound.erase(it);
    }
    std::printf("%-32s %-10s %-16s %-6s %8llu %12llu %14llu %12llu %14llu %8llu %10llu\n",
                r.value("url", "").c_str(), r.value("state", "").c_str(),
                broker.empty() ? "-" : broker.c_str(), r.value("discovered", false) ? "gossip" : "config",
                u64(r, "interest"), u64(r, "messages_in"), u64(r, "bytes_in"), u64(back, "messages_out"),
                u64(back, "bytes_out"), u64(r, "dropped"), u64(r, "reconnects"));
  }
  // Brokers that route here but are not routed to (or not known yet).
  if (!inbound.empty()) {
    std::cout << "\n" << inbound.size() << " route(s) from other brokers only\n";
    std::printf("%-24s %-22s %8s %12s %14s\n", "broker", "peer", "interest", "msgs_out", "bytes_out");
  }
  for (const auto& [broker, x] : inbound) {
    std::printf("%-24s %-22s %8llu %12llu %14llu\n", broker.c_str(), x.value("peer", "").c_str(),
                u64(x, "subscriptions"), u64(x, "messages_out"), u64(x, "bytes_out"));
  }
  return 0;
}

int run_reload(const std::string& socket) {
  // What systemd's ExecReload runs: the exit status is the reload's outcome.
  auto r = rdmabroker::cli::request_reload(socket);
  if (!r) return die_admin(r.error());
  std::cout << r.value() << "\n";
  return 0;
}

/// A subcommand: its options are registered on the app; `run` is called when
/// it is the one parsed. The option values live in the closure's state.
struct Subcommand {
  CLI::App* cmd;
  std::function<int()> run;
};

Subcommand add_pub(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message = "-";
    std::uint64_t count = 1;
    std::vector<std::string> headers;
    std::string file;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("pub", "Publish a message (or each line of stdin with '-', or a file)");
  cmd->add_option("subject", a->subject, "Subject")->required();
  auto* message =
      cmd->add_option("message", a->message, "Message text, or - for stdin lines")->capture_default_str();
  cmd->add_option("-f,--file", a->file, "Publish this file's bytes as one message (-: all of stdin)")
      ->type_name("FILE")
      ->excludes(message);
  cmd->add_option("-n,--count", a->count, "Publish the message this many times")->capture_default_str();
  cmd->add_option("-H,--header", a->headers, "Add the message header NAME=VALUE (repeatable)")
      ->type_name("NAME=VALUE");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_pub(a->common, a->subject, a->message, a->count, a->headers, a->file); }};
}

Subcommand add_sub(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, queue;
    std::uint64_t count = 0;
    bool raw = false;
    double timeout = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("sub", "Subscribe and print messages, each with its headers");
  cmd->add_option("subject", a->subject, "Subject; * matches one token, > the rest")->required();
  cmd->add_option("-q,--queue", a->queue, "Join this queue group: each message goes to one member");
  cmd->add_option("-n,--count", a->count, "Exit after this many messages (0: run until interrupted)")
      ->capture_default_str();
  cmd->add_flag("--raw", a->raw, "Print only the payload (no subject, no headers)");
  cmd->add_option("--timeout", a->timeout, "Fail (exit 3) if not done after this many seconds");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_sub(a->common, a->subject, a->queue, a->count, a->raw, a->timeout); }};
}

Subcommand add_request(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message;
    double timeout = 5;
    std::vector<std::string> headers;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "request", "Send a request and print the first reply (exit 4: no responders, 3: timeout)");
  cmd->add_option("subject", a->subject, "Subject")->required();
  cmd->add_option("message", a->message, "Request text")->required();
  cmd->add_option("--timeout", a->timeout, "Seconds to wait for a reply")->capture_default_str();
  cmd->add_option("-H,--header", a->headers, "Add the request header NAME=VALUE (repeatable)")
      ->type_name("NAME=VALUE");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_request(a->common, a->subject, a->message, a->timeout, a->headers); }};
}

Subcommand add_reply(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message, queue;
    std::uint64_t count = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("reply", "Answer each request on SUBJECT with MESSAGE");
  cmd->add_option("subject", a->subject, "Subject (wildcards allowed)")->required();
  cmd->add_option("message", a->message, "Reply text")->required();
  cmd->add_option("-q,--queue", a->queue, "Join this queue group (responders share the requests)");
  cmd->add_option("-n,--count", a->count, "Exit after this many replies (0: run until interrupted)")
      ->capture_default_str();
  add_common(cmd, a->common);
  return {cmd, [a] { return run_reply(a->common, a->subject, a->queue, a->message, a->count); }};
}

Subcommand add_bench(CLI::App& app) {
  struct Args {
    Common common;
    rdmabroker::bench::BenchOptions bench;
    std::uint32_t busy_poll_us = 0;
    ClientOptions client;
    std::string admin_socket;  // the broker's, to count its wake-ups too
    std::vector<std::string> headers;
    EndpointMode mode;
    std::uint32_t poll_timeout_us = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("bench", "Benchmark: publishers -> subscribers; rates, loss, reordering, latency");
  rdmabroker::bench::add_bench_options(*cmd, a->bench);
  cmd->add_option("--busy-poll-us", a->busy_poll_us,
                  "RDMA: each client's I/O thread spins on its CQ this long after a completion "
                  "(ClientOptions::busy_poll)")
      ->capture_default_str();
  cmd->add_flag("--adaptive-poll", a->client.adaptive_poll,
                "RDMA: each client spins before sleeping as long as its recent wake-ups say pays, up to "
                "--busy-poll-us (0: 200 us) (ClientOptions::adaptive_poll)");
  // A client holds (recv credits + in-flight + queued sends) buffers of the
  // broker's frame size: with very large frames, fewer of each.
  cmd->add_option("--recv-credits", a->client.recv_credits, "Receive buffers per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--recv-buffer-size", a->client.recv_buffer_size,
                  "Bytes per receive buffer (ClientOptions; below the broker's frame size, it cuts what it "
                  "sends to fit)")
      ->capture_default_str();
  cmd->add_option("--inflight-sends", a->client.max_inflight_sends,
                  "Sends in flight per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--send-buffers", a->client.send_queue_buffers,
                  "Queued send buffers per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--admin-socket", a->admin_socket,
                  "The broker's admin socket: its wake-ups during the run are counted too (a broker on this "
                  "host)");
  cmd->add_option("-H,--header", a->headers,
                  "Publish every message with the header NAME=VALUE (repeatable): what headers cost")
      ->type_name("NAME=VALUE");
  cmd->add_flag("--copy", a->mode.copy,
                "Subscribers take each message as an owning Message (subscribe) instead of reading it in "
                "place (subscribe_view): what the copy costs");
  cmd->add_flag(
      "--polled", a->mode.polled,
      "Polled clients (ClientOptions::polled): no I/O thread; a thread of the bench per subscriber calls "
      "poll() until the end, each publisher polls after each publish");
  cmd->add_option(
         "--poll-timeout-us", a->poll_timeout_us,
         "With --polled: a subscriber's poll() waits this long when nothing has arrived (0: spins, a "
         "core per subscriber)")
      ->capture_default_str();
  add_common(cmd, a->common);
  return {cmd, [a] {
            const rdmabroker::Headers headers = headers_or_die(a->headers);
            a->bench.url = server_url(a->common);
            if (!a->admin_socket.empty()) {
              a->bench.broker_wakeups = [socket = a->admin_socket]() -> std::optional<std::uint64_t> {
                auto stats = rdmabroker::cli::admin_command(socket, "stats");
                if (!stats) return std::nullopt;
                std::uint64_t n = 0;
                for (const auto& [key, value] : (*stats)["stats"].items()) {
                  if (key.rfind("wakeups.", 0) == 0) n += value.get<std::uint64_t>();
                }
                return n;
              };
            }
            a->client.busy_poll = std::chrono::microseconds(a->busy_poll_us);
            a->mode.poll_timeout = std::chrono::microseconds(a->poll_timeout_us);
            a->common.set_credentials(a->client);
            return rdmabroker::bench::run_bench(
                a->bench, "rdmabroker", [a, headers](std::string& error, const std::string& url) {
                  return BrokerEndpoint::connect(url, a->common.bind, a->client, headers, a->mode, error);
                });
          }};
}

Subcommand add_stat(CLI::App& app) {
  struct Args {
    std::string socket = rdmabroker::cli::kDefaultAdminSocket;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("stat", "Show the broker's counters");
  cmd->add_option("--admin-socket", a->socket, "The broker's admin socket")->capture_default_str();
  cmd->add_flag("--json", a->json, "JSON output");
  return {cmd, [a] { return run_stat(a->socket, a->json); }};
}

Subcommand add_reload(CLI::App& app) {
  auto socket = std::make_shared<std::string>(rdmabroker::cli::kDefaultAdminSocket);
  auto* cmd =
      app.add_subcommand("reload", "Reload the broker's configuration file (exit 1 if refused or invalid)");
  cmd->add_option("--admin-socket", *socket, "The broker's admin socket")->capture_default_str();
  return {cmd, [socket] { return run_reload(*socket); }};
}

Subcommand add_passwd(CLI::App& app) {
  struct Args {
    std::string scheme = "yescrypt";
    unsigned long cost = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("passwd", "Hash a password or token read from stdin for the broker's auth.users");
  cmd->add_option("--scheme", a->scheme, "yescrypt, sha512crypt or bcrypt")->capture_default_str();
  cmd->add_option("--cost", a->cost, "The scheme's cost parameter (0: its default)")->capture_default_str();
  return {cmd, [a] { return run_passwd(a->scheme, a->cost); }};
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  CLI::App app{"rdmabroker: publish, subscribe and inspect an rdmabrokerd broker"};
  app.set_version_flag("--version", std::string("rdmabroker ") + RDMABROKER_VERSION);
  app.require_subcommand(1);
  const Subcommand commands[] = {add_pub(app),   add_sub(app),  add_request(app), add_reply(app),
                                 add_bench(app), add_stat(app), add_reload(app),  add_passwd(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with 0; a usage error with CLI11's
    // message and our one exit code for it (CLI11's own are 100 and more).
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  for (const auto& c : commands) {
    if (c.cmd->parsed()) return c.run();
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}
