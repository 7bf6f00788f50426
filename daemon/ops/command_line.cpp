// SPDX-License-Identifier: Apache-2.0
#include "ops/command_line.hpp"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <sstream>

namespace rdmabroker::daemon {

namespace {

using config::Config;

/// One overriding flag: registered with CLI11, and after parsing turned into
/// a GivenFlag when the operator gave it. Keys name a whole setting
/// ("limits.max_connections") or one part of it ("listen.rdma:host").
struct FlagDef {
  std::string names;  // CLI11 form, e.g. "-a,--listen"
  std::string help;
  std::vector<std::string> keys;
  /// Registers the option; returns what turns its parsed value into a setter.
  std::function<std::function<std::function<void(Config&)>()>(CLI::App&, const FlagDef&)> add;
};

template <typename T>
FlagDef flag(std::string names, std::string help, std::vector<std::string> keys,
             std::function<void(Config&, const T&)> set, CLI::Validator check = CLI::Validator()) {
  FlagDef d{std::move(names), std::move(help), std::move(keys), {}};
  d.add = [set, check](CLI::App& app, const FlagDef& self) {
    auto value = std::make_shared<T>();
    CLI::Option* opt = app.add_option(self.names, *value, self.help)->check(check);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
    return std::function<std::function<void(Config&)>()>([opt, value, set]() -> std::function<void(Config&)> {
      if (opt->count() == 0) return {};
      return [value, set](Config& c) { set(c, *value); };
    });
  };
  return d;
}

FlagDef switch_flag(std::string names, std::string help, std::vector<std::string> keys,
                    std::function<void(Config&)> set) {
  FlagDef d{std::move(names), std::move(help), std::move(keys), {}};
  d.add = [set](CLI::App& app, const FlagDef& self) {
    CLI::Option* opt = app.add_flag(self.names, self.help);
    return std::function<std::function<void(Config&)>()>([opt, set]() -> std::function<void(Config&)> {
      if (opt->count() == 0) return {};
      return set;
    });
  };
  return d;
}

/// A flag for one setting: its value is read as the setting's YAML value
/// would be (config::set: the same forms, ranges and messages as the file).
FlagDef key_flag(std::string names, std::string help, std::string key) {
  FlagDef d{std::move(names), std::move(help), {key}, {}};
  d.add = [key](CLI::App& app, const FlagDef& self) {
    auto value = std::make_shared<std::string>();
    CLI::Option* opt = app.add_option(self.names, *value, self.help);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
    // Checked as it is parsed, so that a bad value stops the broker at once.
    opt->check(CLI::Validator(
        [key](std::string& v) {
          Config scratch;
          return config::set(scratch, key, v).value_or("");
        },
        "", key));
    return std::function<std::function<void(Config&)>()>([opt, value, key]() -> std::function<void(Config&)> {
      if (opt->count() == 0) return {};
      return [value, key](Config& c) { config::set(c, key, *value); };
    });
  };
  return d;
}

/// The flags, in the order they apply: broader before narrower.
const std::vector<FlagDef>& flag_table() {
  using u16 = std::uint16_t;
  static const std::vector<FlagDef> kFlags = {
      flag<std::string>("-a,--listen",
                        "Address of every client listener: RDMA and TCP (--tcp-listen narrows TCP)",
                        {"listen.rdma:host", "listen.tcp:host"},
                        [](Config& c, const std::string& v) {
                          c.broker.listen_address = v;
                          c.broker.tcp_listen_address = v;
                        }),
      flag<u16>("-p,--port", "RDMA CM port", {"listen.rdma:port"},
                [](Config& c, const u16& v) { c.broker.port = v; }),
      flag<std::string>("--tcp-listen", "Address of the TCP listener (wins over --listen for TCP)",
                        {"listen.tcp:host"},
                        [](Config& c, const std::string& v) { c.broker.tcp_listen_address = v; }),
      flag<u16>("--tcp-port", "TCP port (0: no TCP listener)", {"listen.tcp:port"},
                [](Config& c, const u16& v) { c.broker.tcp_port = v; }),
      key_flag("--rdma", "auto, on or off", "rdma"),
      key_flag("-w,--workers", "Worker threads (0: one per core, at most 8)", "workers"),
      key_flag("--buffer-size", "Receive buffer size = largest frame", "buffers.size"),
      key_flag("--pool-buffers", "Buffers in the registered pool", "buffers.pool"),
      key_flag("--srq-depth", "Receives per SRQ", "buffers.srq_depth"),
      key_flag("--credits", "Most receive credits an RDMA client holds", "flow.credits"),
      key_flag("--max-inflight-sends", "Sends in flight per connection", "flow.max_inflight_sends"),
      key_flag("--busy-poll-us", "Spin on the CQs this long after the last work before sleeping (0: never)",
               "flow.busy_poll_us"),
      key_flag("--adaptive-poll", "true: the spin tunes itself, up to --busy-poll-us (0: 200 us)",
               "flow.adaptive_poll"),
      key_flag("--max-pending-bytes", "Bytes queued per subscriber before it is a slow consumer",
               "limits.max_pending_bytes"),
      key_flag("--pool-share-percent", "Most of the buffer pool one subscriber's queue may hold",
               "limits.pool_share_percent"),
      key_flag("--user-pool-share-percent",
               "Most of the buffer pool one user's (anonymous: one address's) queues may hold together",
               "limits.user_pool_share_percent"),
      key_flag("--user-subscription-share-percent",
               "Most of the broker-wide subscription limits one user (anonymous: one address) may take",
               "limits.user_subscription_share_percent"),
      key_flag("--write-deadline-ms", "Slow-consumer write deadline", "slow_consumer.write_deadline_ms"),
      key_flag("--producer-stall-ms", "How long publishers wait for a backlogged subscriber",
               "slow_consumer.producer_stall_ms"),
      key_flag("--max-connections", "Connection limit", "limits.max_connections"),
      key_flag("--max-subscriptions", "Subscriptions per connection", "limits.max_subscriptions"),
      key_flag("--max-unauthenticated", "Connections not authenticated yet (0: a quarter of the limit)",
               "limits.max_unauthenticated"),
      key_flag("--max-unauthenticated-per-address", "Connections not authenticated yet from one address",
               "limits.max_unauthenticated_per_address"),
      key_flag("--frame-timeout-ms", "A TCP frame begun must be complete within this",
               "limits.frame_timeout_ms"),
      key_flag("--fragment-timeout-ms", "The next fragment of a message must come within this",
               "limits.fragment_timeout_ms"),
      key_flag("--auth-timeout-ms", "From connecting until CONNECT is accepted", "auth.timeout_ms"),
      key_flag("--auth-failure-delay-ms", "After a failed login, the address's next check waits this long",
               "auth.failure_delay_ms"),
      key_flag("--auth-cache-ttl-s", "A credential verified within this is accepted without crypt(3)",
               "auth.cache_ttl_s"),
      key_flag("--admin-socket", "Unix socket for `rdmabroker stat`/`reload` (\"\": none)", "admin.socket"),
      key_flag("--metrics-listen", "Prometheus endpoint host:port (\"\": none)", "metrics.listen"),
      switch_flag("--allow-anonymous", "Accept clients without credentials (auth.anonymous: true)",
                  {"auth.anonymous"}, [](Config& c) { c.broker.auth.anonymous = true; }),
      key_flag("--log-level", "trace, debug, info, warn, error", "logging.level"),
  };
  return kFlags;
}

std::string long_name(const std::string& names) {
  const auto pos = names.find("--");
  return pos == std::string::npos ? names : names.substr(pos);
}

}  // namespace

void CommandLine::apply(Config& c) const {
  for (const auto& f : flags) f.apply(c);
}

std::optional<std::string> CommandLine::flag_for(std::string_view key) const {
  std::optional<std::string> out;
  for (const auto& f : flags) {
    for (const auto& k : f.keys) {
      if (k == key) out = f.name;
    }
  }
  return out;
}

std::variant<CommandLine, CommandLineExit> parse_command_line(int argc, const char* const* argv) {
  CLI::App app{
      "rdmabrokerd: RDMA topic message broker.\n"
      "Settings come from built-in defaults, then the config file, then these flags: a flag always wins,\n"
      "on start and on every reload (docs/configuration.md, \"Precedence\")."};
  app.set_version_flag("--version", std::string("rdmabrokerd ") + RDMABROKER_VERSION);
  CommandLine cl;
  bool no_config = false;
  app.add_option(
      "-c,--config", cl.config_path,
      std::string("YAML configuration file (default: ") + config::kDefaultConfigPath + " if it exists)");
  app.add_flag("--no-config", no_config,
               "Read no file, not even the default one: built-in defaults and flags only");
  auto* check =
      app.add_option("--check-config", cl.check_path,
                     "Validate a configuration file (default: --config's), print the effective listen "
                     "addresses and where each came from, and exit")
          ->expected(0, 1);
  app.add_flag(
         "--reload", cl.reload_only,
         "Ask the running broker (through --admin-socket, default /run/rdmabroker/admin.sock) to reload "
         "its configuration file; print the outcome and exit 0, or 1 if the reload was refused")
      ->excludes(check);
  std::vector<std::function<std::function<void(Config&)>()>> given;
  for (const auto& def : flag_table()) given.push_back(def.add(app, def));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    return CommandLineExit{code, out.str() + err.str()};
  }
  if (no_config && !cl.config_path.empty()) {
    return CommandLineExit{2, "rdmabrokerd: --config and --no-config contradict each other\n"};
  }
  cl.check_only = check->count() > 0;
  for (std::size_t i = 0; i < given.size(); ++i) {
    if (auto set = given[i]()) {
      cl.flags.push_back(GivenFlag{long_name(flag_table()[i].names), flag_table()[i].keys, std::move(set)});
    }
  }
  if (no_config) {
    cl.config_origin = "none (--no-config)";
  } else if (!cl.config_path.empty()) {
    cl.config_origin = cl.config_path + " (--config)";
  } else if (std::filesystem::exists(config::kDefaultConfigPath)) {
    cl.config_path = config::kDefaultConfigPath;
    cl.config_origin = cl.config_path + " (the default path)";
  } else {
    cl.config_origin = std::string("none (no file at the default path ") + config::kDefaultConfigPath + ")";
  }
  return cl;
}

std::vector<std::pair<std::string, std::vector<std::string>>> overriding_flags() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& def : flag_table()) out.emplace_back(long_name(def.names), def.keys);
  return out;
}

std::vector<std::string> describe_listeners(const Config& effective, const CommandLine& cl,
                                            const std::string& path) {
  const std::string file = "file " + path;
  auto from_file = [&](const std::string& key) { return !path.empty() && effective.file_keys.contains(key); };
  // The source of one part ("host" or "port") of a listen.* key.
  auto part_source = [&](const std::string& key, const std::string& part) -> std::string {
    if (auto f = cl.flag_for(key + ":" + part)) return *f;
    if (from_file(key)) return file;
    return "default";
  };
  auto line = [](const std::string& key, const std::string& value, const std::string& source) {
    return key + " " + (value.empty() ? std::string("off") : value) + " (" + source + ")";
  };
  std::vector<std::string> out;
  const auto& b = effective.broker;
  const std::string rdma_host = part_source("listen.rdma", "host");
  out.push_back(line("listen.rdma", *config::show(effective, "listen.rdma"),
                     b.rdma == config::RdmaMode::kOff
                         ? "RDMA off: " + std::string(cl.flag_for("rdma") ? "--rdma"
                                                      : from_file("rdma") ? file
                                                                          : "default")
                         : "host: " + rdma_host + "; port: " + part_source("listen.rdma", "port")));
  std::string tcp_host = part_source("listen.tcp", "host");
  if (tcp_host == "default" && b.tcp_listen_address.empty()) tcp_host = "listen.rdma's host, " + rdma_host;
  out.push_back(line("listen.tcp", *config::show(effective, "listen.tcp"),
                     "host: " + tcp_host + "; port: " + part_source("listen.tcp", "port")));
  // The route listeners, when the file opens them (no flag sets them).
  for (const char* key : {"cluster.listen_rdma", "cluster.listen_tcp"}) {
    const auto value = config::show(effective, key);
    if (value && !value->empty()) out.push_back(line(key, *value, file));
  }
  for (const char* key : {"metrics.listen", "admin.socket"}) {
    const auto flag = cl.flag_for(key);
    out.push_back(line(key, *config::show(effective, key), flag ? *flag : from_file(key) ? file : "default"));
  }
  return out;
}

}  // namespace rdmabroker::daemon
