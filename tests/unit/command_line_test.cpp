// SPDX-License-Identifier: Apache-2.0
// rdmabrokerd's precedence rule (docs/configuration.md, "Precedence"):
// default < file < flag, for every flag that has a config key, and the
// explanation of where each listen address came from.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "ops/command_line.hpp"

namespace rdmabroker::daemon {
namespace {

CommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), {"rdmabrokerd", "--no-config"});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  auto r = parse_command_line(static_cast<int>(argv.size()), argv.data());
  if (auto* e = std::get_if<CommandLineExit>(&r)) ADD_FAILURE() << e->text;
  return std::get<CommandLine>(r);
}

config::Config file(const std::string& yaml) {
  auto c = config::parse(yaml, "broker.yaml");
  EXPECT_TRUE(c) << c.error().message;
  return c.value();
}

/// Per flag: a file that sets its key(s), the flag's value, and what the
/// key(s) must then show. Every overriding flag must be here.
struct Case {
  std::string yaml;
  std::string value;                          // "" for a switch
  std::map<std::string, std::string> expect;  // key -> shown value with the flag
};
const std::map<std::string, Case> kCases = {
    {"--listen",
     {"listen: {rdma: 10.0.0.1:7000, tcp: 10.0.0.2:7001}\n",
      "127.0.0.1",
      {{"listen.rdma", "127.0.0.1:7000"}, {"listen.tcp", "127.0.0.1:7001"}}}},
    {"--port", {"listen: {rdma: 10.0.0.1:7000}\n", "7100", {{"listen.rdma", "10.0.0.1:7100"}}}},
    {"--tcp-listen", {"listen: {tcp: 10.0.0.2:7001}\n", "127.0.0.3", {{"listen.tcp", "127.0.0.3:7001"}}}},
    {"--tcp-port", {"listen: {tcp: 10.0.0.2:7001}\n", "7200", {{"listen.tcp", "10.0.0.2:7200"}}}},
    {"--rdma", {"rdma: on\n", "off", {{"rdma", "off"}}}},
    {"--workers", {"workers: 4\n", "3", {{"workers", "3"}}}},
    {"--buffer-size", {"buffers: {size: 8KiB}\n", "32768", {{"buffers.size", "32768"}}}},
    {"--pool-buffers", {"buffers: {pool: 4096}\n", "2048", {{"buffers.pool", "2048"}}}},
    {"--srq-depth", {"buffers: {srq_depth: 512}\n", "256", {{"buffers.srq_depth", "256"}}}},
    {"--credits", {"flow: {credits: 16}\n", "8", {{"flow.credits", "8"}}}},
    {"--max-inflight-sends", {"flow: {max_inflight_sends: 4}\n", "2", {{"flow.max_inflight_sends", "2"}}}},
    {"--busy-poll-us", {"flow: {busy_poll_us: 10}\n", "50", {{"flow.busy_poll_us", "50"}}}},
    {"--adaptive-poll", {"flow: {adaptive_poll: false}\n", "true", {{"flow.adaptive_poll", "true"}}}},
    {"--max-pending-bytes",
     {"limits: {max_pending_bytes: 16MiB}\n", "1048576", {{"limits.max_pending_bytes", "1048576"}}}},
    {"--pool-share-percent",
     {"limits: {pool_share_percent: 20}\n", "30", {{"limits.pool_share_percent", "30"}}}},
    {"--user-pool-share-percent",
     {"limits: {user_pool_share_percent: 20}\n", "40", {{"limits.user_pool_share_percent", "40"}}}},
    {"--user-subscription-share-percent",
     {"limits: {user_subscription_share_percent: 20}\n",
      "5",
      {{"limits.user_subscription_share_percent", "5"}}}},
    {"--write-deadline-ms",
     {"slow_consumer: {write_deadline_ms: 500}\n", "700", {{"slow_consumer.write_deadline_ms", "700"}}}},
    {"--producer-stall-ms",
     {"slow_consumer: {producer_stall_ms: 20}\n", "30", {{"slow_consumer.producer_stall_ms", "30"}}}},
    {"--max-connections", {"limits: {max_connections: 100}\n", "50", {{"limits.max_connections", "50"}}}},
    {"--max-subscriptions",
     {"limits: {max_subscriptions: 50}\n", "60", {{"limits.max_subscriptions", "60"}}}},
    {"--max-unauthenticated",
     {"limits: {max_unauthenticated: 50}\n", "60", {{"limits.max_unauthenticated", "60"}}}},
    {"--max-unauthenticated-per-address",
     {"limits: {max_unauthenticated_per_address: 5}\n",
      "6",
      {{"limits.max_unauthenticated_per_address", "6"}}}},
    {"--frame-timeout-ms",
     {"limits: {frame_timeout_ms: 500}\n", "600", {{"limits.frame_timeout_ms", "600"}}}},
    {"--fragment-timeout-ms",
     {"limits: {fragment_timeout_ms: 500}\n", "600", {{"limits.fragment_timeout_ms", "600"}}}},
    {"--auth-timeout-ms", {"auth: {timeout_ms: 500}\n", "600", {{"auth.timeout_ms", "600"}}}},
    {"--auth-failure-delay-ms", {"auth: {failure_delay_ms: 50}\n", "60", {{"auth.failure_delay_ms", "60"}}}},
    {"--auth-cache-ttl-s", {"auth: {cache_ttl_s: 5}\n", "0", {{"auth.cache_ttl_s", "0"}}}},
    {"--admin-socket", {"admin: {socket: /run/a.sock}\n", "/tmp/b.sock", {{"admin.socket", "/tmp/b.sock"}}}},
    {"--metrics-listen",
     {"metrics: {listen: \"0.0.0.0:9500\"}\n", "127.0.0.1:9600", {{"metrics.listen", "127.0.0.1:9600"}}}},
    {"--allow-anonymous", {"auth: {anonymous: false}\n", "", {{"auth.anonymous", "true"}}}},
    {"--log-level", {"logging: {level: debug}\n", "error", {{"logging.level", "error"}}}},
};

TEST(CommandLine, EveryFlagWinsOverTheFileForEveryKeyItClaims) {
  std::set<std::string> covered;
  for (const auto& [flag, keys] : overriding_flags()) {
    SCOPED_TRACE(flag);
    auto it = kCases.find(flag);
    ASSERT_NE(it, kCases.end()) << flag << " has no precedence test case: add one";
    covered.insert(flag);
    const Case& k = it->second;
    // The file alone sets the key(s) away from their defaults...
    config::Config from_file = file(k.yaml);
    const config::Config defaults = file("");
    std::set<std::string> claimed;
    for (const auto& key : keys) claimed.insert(key.substr(0, key.find(':')));
    for (const auto& key : claimed) {
      ASSERT_TRUE(config::show(defaults, key)) << "unknown key " << key;
      EXPECT_TRUE(from_file.file_keys.contains(key) || key == "listen.tcp") << key;
    }
    // ...and the flag wins over the file, for each key it claims.
    std::vector<std::string> args{flag};
    if (!k.value.empty()) args.push_back(k.value);
    const CommandLine cl = parse(args);
    cl.apply(from_file);
    EXPECT_EQ(claimed.size(), k.expect.size());
    for (const auto& [key, shown] : k.expect) {
      EXPECT_TRUE(claimed.contains(key)) << flag << " does not declare " << key;
      EXPECT_EQ(*config::show(from_file, key), shown) << key;
      EXPECT_EQ(cl.flag_for(key).value_or(
                    cl.flag_for(key + ":host").value_or(cl.flag_for(key + ":port").value_or(""))),
                flag);
    }
  }
  EXPECT_EQ(covered.size(), kCases.size()) << "a case names a flag that no longer exists";
}

TEST(CommandLine, ListenSetsEveryListenerAndTcpListenNarrowsItWhateverTheOrder) {
  // The reported case: the file puts TCP on 127.0.0.2, --listen 127.0.0.1 must win.
  config::Config c = file("listen:\n  tcp: 127.0.0.2:25223\nrdma: off\n");
  parse({"--listen", "127.0.0.1"}).apply(c);
  EXPECT_EQ(*config::show(c, "listen.tcp"), "127.0.0.1:25223");
  for (const auto& order : {std::vector<std::string>{"--tcp-listen", "::1", "--listen", "127.0.0.1"},
                            std::vector<std::string>{"--listen", "127.0.0.1", "--tcp-listen", "::1"}}) {
    config::Config d = file("");
    parse(order).apply(d);
    EXPECT_EQ(d.broker.listen_address, "127.0.0.1");
    EXPECT_EQ(d.broker.tcp_listen_address, "::1");
  }
}

TEST(CommandLine, ALaterFlagOverridesAnEarlierOne) {
  config::Config c = file("");
  parse({"--workers", "2", "--workers", "5"}).apply(c);
  EXPECT_EQ(c.broker.workers, 5u);
}

TEST(CommandLine, ListenersSayWhereEachPartCameFrom) {
  config::Config c = file("listen:\n  tcp: 127.0.0.2:25223\nmetrics: {listen: \"127.0.0.1:9500\"}\n");
  const CommandLine cl = parse({"--listen", "127.0.0.1", "--port", "7600"});
  cl.apply(c);
  const auto lines = describe_listeners(c, cl, "broker.yaml");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "listen.rdma 127.0.0.1:7600 (host: --listen; port: --port)");
  EXPECT_EQ(lines[1], "listen.tcp 127.0.0.1:25223 (host: --listen; port: file broker.yaml)");
  EXPECT_EQ(lines[2], "metrics.listen 127.0.0.1:9500 (file broker.yaml)");
  EXPECT_EQ(lines[3], "admin.socket /run/rdmabroker/admin.sock (default)");
  // No file, no flags: TCP follows the RDMA host, both defaults.
  config::Config d = file("");
  const auto plain = describe_listeners(d, parse({}), "");
  EXPECT_EQ(plain[1], "listen.tcp 0.0.0.0:7471 (host: listen.rdma's host, default; port: default)");
  EXPECT_EQ(plain.size(), 4u) << "no route listener unless the file opens one";
  // A cluster's route listeners, which only the file sets.
  config::Config r = file("cluster: {name: prod, user: u, password: p, listen_tcp: '0.0.0.0:7473'}\n");
  const auto routed = describe_listeners(r, parse({}), "broker.yaml");
  ASSERT_EQ(routed.size(), 5u);
  EXPECT_EQ(routed[2], "cluster.listen_tcp 0.0.0.0:7473 (file broker.yaml)");
}

TEST(CommandLine, NoConfigReadsNoFileAndContradictsConfig) {
  const CommandLine cl = parse({});
  EXPECT_EQ(cl.config_path, "");
  EXPECT_EQ(cl.config_origin, "none (--no-config)");
  const char* argv[] = {"rdmabrokerd", "--no-config", "--config", "x.yaml"};
  auto r = parse_command_line(4, argv);
  ASSERT_TRUE(std::holds_alternative<CommandLineExit>(r));
  EXPECT_EQ(std::get<CommandLineExit>(r).code, 2);
}

TEST(CommandLine, BadFlagsExitWithUsage) {
  const char* argv[] = {"rdmabrokerd", "--rdma", "sometimes"};
  auto r = parse_command_line(3, argv);
  ASSERT_TRUE(std::holds_alternative<CommandLineExit>(r));
  EXPECT_NE(std::get<CommandLineExit>(r).code, 0);
}

// A flag's value is read as the file's would be: the same forms, the same
// ranges, the same message naming the setting; a bad one stops the broker.
TEST(CommandLine, FlagValuesAreCheckedLikeTheFile) {
  auto exit_text = [](std::vector<const char*> argv) {
    argv.insert(argv.begin(), "rdmabrokerd");
    auto r = parse_command_line(static_cast<int>(argv.size()), argv.data());
    if (!std::holds_alternative<CommandLineExit>(r)) return std::string("accepted");
    EXPECT_NE(std::get<CommandLineExit>(r).code, 0);  // CLI11's code for a value it refused
    return std::get<CommandLineExit>(r).text;
  };
  EXPECT_NE(exit_text({"--credits", "1"}).find("must be between 4 and 65535, got 1"), std::string::npos);
  EXPECT_NE(exit_text({"--buffer-size", "lots"}).find("expected a size"), std::string::npos);
  EXPECT_NE(exit_text({"--log-level", "loud"}).find("expected one of trace"), std::string::npos);
  // Sizes take the file's units.
  config::Config c = file("");
  parse({"--max-pending-bytes", "2MiB"}).apply(c);
  EXPECT_EQ(c.broker.max_pending_bytes, 2u << 20);
  // What ties settings together is checked once the flags are applied.
  config::Config both = file("buffers: {size: 64KiB}\n");
  parse({"--max-pending-bytes", "64KiB"}).apply(both);
  const auto valid = config::validate(both);
  ASSERT_FALSE(valid);
  EXPECT_NE(valid.error().message.find("limits.max_pending_bytes: must be at least 4 buffers"),
            std::string::npos)
      << valid.error().message;
}

}  // namespace
}  // namespace rdmabroker::daemon
