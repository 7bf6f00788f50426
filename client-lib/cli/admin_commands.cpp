// SPDX-License-Identifier: Apache-2.0
// The CLI's operator subcommands: `stat` and `reload` through the broker's
// admin socket (admin_client.hpp), and `passwd`, which hashes a secret for
// auth.users.
#include <crypt.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "admin_client.hpp"
#include "commands.hpp"

namespace rdmabroker::cli {

namespace {

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

/// `stat`'s routes of a broker in a cluster (docs/cluster.md): one row per
/// other broker, both ways. Its route there (the broker's id from that
/// broker's INFO) says what it brought; that broker's route here (a
/// connection naming the same broker) what was sent to it.
void print_routes(const nlohmann::json& routes, const nlohmann::json& c) {
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
  print_routes(routes, c);
  return 0;
}

int run_reload(const std::string& socket) {
  // What systemd's ExecReload runs: the exit status is the reload's outcome.
  auto r = rdmabroker::cli::request_reload(socket);
  if (!r) return die_admin(r.error());
  std::cout << r.value() << "\n";
  return 0;
}

}  // namespace

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

}  // namespace rdmabroker::cli
