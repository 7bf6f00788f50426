// SPDX-License-Identifier: Apache-2.0
// The YAML loader: defaults, every section, and one case per kind of mistake,
// each reported with file, line, column and key; diff() for reload.
#include <gtest/gtest.h>

#include <set>

#include <fstream>
#include <iterator>
#include <map>

#include "rdmabroker/config/config.hpp"
#include "unit/config_errors.hpp"
#include "test_paths.hpp"

namespace rdmabroker::config {
namespace {

TEST(Config, EmptyFileMeansDefaults) {
  auto c = parse("", "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->broker.port, 7470);
  EXPECT_EQ(c->broker.tcp_port, 7471);
  EXPECT_EQ(c->broker.buffer_size, 16384u);
  EXPECT_EQ(c->log.level, "info");
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
}

TEST(Config, EverySectionIsRead) {
  auto c = parse(R"(
listen:
  rdma: 10.0.0.1:7000
  tcp: "[::]:7001"
rdma: on
devices: [mlx5_0, mlx5_1]
workers: 4
buffers: {size: 8KiB, pool: 4096, srq_depth: 512}
flow: {credits: 16, max_inflight_sends: 4}
limits:
  max_connections: 100
  max_payload: 4000
  max_subscriptions: 50
  max_pending_bytes: 16MiB
slow_consumer: {write_deadline_ms: 500, producer_stall_ms: 20, drain_timeout_ms: 1000}
metrics: {listen: "0.0.0.0:9500"}
admin: {socket: /run/x.sock}
logging: {level: debug, format: json, target: console}
)",
                 "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  const auto& b = c->broker;
  EXPECT_EQ(b.listen_address, "10.0.0.1");
  EXPECT_EQ(b.port, 7000);
  EXPECT_EQ(b.tcp_listen_address, "::");
  EXPECT_EQ(b.tcp_port, 7001);
  EXPECT_EQ(b.rdma, RdmaMode::kOn);
  EXPECT_EQ(b.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(b.workers, 4u);
  EXPECT_EQ(b.buffer_size, 8192u);
  EXPECT_EQ(b.pool_buffers, 4096u);
  EXPECT_EQ(b.srq_depth, 512u);
  EXPECT_EQ(b.credits, 16u);
  EXPECT_EQ(b.max_inflight_sends, 4u);
  EXPECT_EQ(b.max_connections, 100u);
  EXPECT_EQ(b.max_payload, 4000u);
  EXPECT_EQ(b.max_subscriptions, 50u);
  EXPECT_EQ(b.max_pending_bytes, 16u << 20);
  EXPECT_EQ(b.write_deadline_ms, 500u);
  EXPECT_EQ(b.producer_stall_ms, 20u);
  EXPECT_EQ(b.drain_timeout_ms, 1000u);
  EXPECT_EQ(c->metrics_listen, "0.0.0.0:9500");
  EXPECT_EQ(b.admin_socket, "/run/x.sock");
  EXPECT_EQ(c->log.level, "debug");
  EXPECT_EQ(c->log.format, LogFormat::kJson);
  EXPECT_EQ(c->log.target, LogTarget::kConsole);
}

TEST(Config, TcpCanBeTurnedOff) {
  auto c = parse("listen: {tcp: \"\"}\n", "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->broker.tcp_port, 0);
}

TEST(Config, UnknownKeysNameFileLineColumnAndKey) {
  EXPECT_EQ(errors_of("workers: 2\nwrokers: 3\n"), "broker.yaml:2:1: wrokers: unknown key");
  EXPECT_EQ(errors_of("limits:\n  max_subscriptons: 5\n"),
            "broker.yaml:2:3: limits.max_subscriptons: unknown key");
}

TEST(Config, WrongTypesAndValuesSayWhatIsExpected) {
  EXPECT_EQ(errors_of("workers: many\n"),
            "broker.yaml:1:10: workers: expected an integer between 0 and 64, got 'many'");
  EXPECT_EQ(errors_of("workers: 65\n"), "broker.yaml:1:10: workers: must be between 0 and 64, got 65");
  EXPECT_EQ(
      errors_of("limits:\n  max_pending_bytes: 3 lots\n"),
      "broker.yaml:2:22: limits.max_pending_bytes: expected a size (bytes, or with KiB/MiB/GiB) between 4096 "
      "and 1099511627776, got '3 lots'");
  EXPECT_EQ(errors_of("rdma: maybe\n"), "broker.yaml:1:7: rdma: expected one of auto, on, off, got 'maybe'");
  EXPECT_EQ(errors_of("logging: {level: loud}\n"),
            "broker.yaml:1:18: logging.level: expected one of trace, debug, info, warn, error, critical, "
            "off, got 'loud'");
  EXPECT_EQ(errors_of("listen: {rdma: 10.0.0.1}\n"),
            "broker.yaml:1:16: listen.rdma: address '10.0.0.1': no port (expected host:port, e.g. "
            "0.0.0.0:7470 or [::]:7470)");
  EXPECT_EQ(errors_of("buffers: 4096\n"),
            "broker.yaml:1:10: buffers: expected a mapping (a section of settings)");
  EXPECT_EQ(errors_of("devices: mlx5_0\n"),
            "broker.yaml:1:10: devices: expected a list of RDMA device names, e.g. [mlx5_0] (empty: all)");
  EXPECT_EQ(errors_of("- a\n- b\n"), "broker.yaml:1:1: expected a mapping of settings at the top level");
}

TEST(Config, EveryProblemIsReportedNotJustTheFirst) {
  const auto e = errors_of("workers: x\nflow: {credits: 1}\nbogus: 1\n");
  EXPECT_NE(e.find("broker.yaml:1:10: workers:"), std::string::npos) << e;
  EXPECT_NE(e.find("broker.yaml:2:17: flow.credits: must be between 4 and 65535"), std::string::npos) << e;
  EXPECT_NE(e.find("broker.yaml:3:1: bogus: unknown key"), std::string::npos) << e;
}

TEST(Config, RulesAcrossSettings) {
  EXPECT_NE(errors_of("buffers: {size: 1100}\n").find("buffers.size: must be a multiple of 64"),
            std::string::npos);
  EXPECT_NE(
      errors_of("buffers: {size: 64KiB}\nlimits: {max_pending_bytes: 128KiB}\n")
          .find("broker.yaml:2:29: limits.max_pending_bytes: must be at least 4 buffers (262144 bytes)"),
      std::string::npos);
  // Messages larger than a buffer travel as fragments: 64 MiB whatever buffers.size is, not more.
  auto rdv = parse("limits: {rendezvous_min: 256KiB}\n", "broker.yaml");
  ASSERT_TRUE(rdv) << rdv.error().message;
  EXPECT_EQ(rdv->broker.rendezvous_min, 256u << 10);
  EXPECT_EQ(parse("limits: {rendezvous_min: 0}\n", "broker.yaml")->broker.rendezvous_min, 0u) << "0: none";
  EXPECT_EQ(config::BrokerOptions{}.rendezvous_min, 64u << 10) << "the default";
  EXPECT_NE(errors_of("limits: {rendezvous_min: 65MiB}\n").find("limits.rendezvous_min"), std::string::npos);
  auto big = parse("limits: {max_payload: 64MiB}\n", "broker.yaml");
  ASSERT_TRUE(big) << big.error().message;
  EXPECT_EQ(big->broker.max_payload, 64u << 20);
  EXPECT_NE(errors_of("limits: {max_payload: 65MiB}\n").find("limits.max_payload"), std::string::npos);
  EXPECT_NE(errors_of("rdma: off\nlisten: {tcp: \"\"}\n").find("rdma: RDMA is off and listen.tcp is empty"),
            std::string::npos);
}

TEST(Config, SyntaxErrorsHaveAPosition) {
  const auto e = errors_of("workers: [1, 2\n");
  EXPECT_EQ(e.rfind("broker.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find("YAML syntax"), std::string::npos) << e;
}

TEST(Config, LoadReadsAFileAndNamesIt) {
  const std::string path = ::testing::TempDir() + "/rdmabroker-config-test.yaml";
  {
    std::ofstream out(path);
    out << "workers: 2\nlimits: {max_subscriptions: zero}\n";
  }
  auto c = load(path);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message.rfind(path + ":2:", 0), 0u) << c.error().message;
  auto missing = load(path + ".missing");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("cannot read"), std::string::npos);
}

TEST(Config, DiffSaysWhatChangedAndWhetherItMayChangeLive) {
  auto a = parse("", "a");
  auto b = parse("logging: {level: debug}\nlimits: {max_subscriptions: 5}\nbuffers: {size: 8KiB}\n", "b");
  ASSERT_TRUE(a && b);
  const auto changes = diff(a.value(), b.value());
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "buffers.size");
  EXPECT_FALSE(changes[0].live);
  EXPECT_EQ(changes[0].from, "16384");
  EXPECT_EQ(changes[0].to, "8192");
  EXPECT_EQ(changes[1].key, "limits.max_subscriptions");
  EXPECT_TRUE(changes[1].live);
  EXPECT_EQ(changes[2].key, "logging.level");
  EXPECT_TRUE(changes[2].live);
  EXPECT_EQ(changes[2].to, "debug");
  EXPECT_TRUE(diff(a.value(), a.value()).empty());
}

// ---------------------------------------------------------------- auth

constexpr const char* kHash =
    "$6$rounds=1000$fnhyAvh8lJCQuE45$XMCSqNzrnurY8jX7KFED7igC0gRZaiMHdqP5qrrAuI."
    "RVWcDhtbeqKhwKeu265AN3c5WjQag5PSCv8SzQyt7O1";

// What a reload hands the workers: every live setting of the new file, and
// none of the others (they cannot change without a restart).
TEST(Config, CopyLiveTakesTheLiveSettingsAndNothingElse) {
  EXPECT_TRUE(live_keys_without_copy().empty()) << live_keys_without_copy().front();
  auto running = parse("", "a.yaml");
  auto next = parse(R"(
listen: {rdma: 10.0.0.1:7000, tcp: "10.0.0.1:7001"}
rdma: on
devices: [mlx5_0]
workers: 4
buffers: {size: 8KiB, pool: 4096, srq_depth: 512}
flow: {credits: 16, max_inflight_sends: 4, busy_poll_us: 50}
limits:
  max_connections: 100
  max_payload: 4000
  max_subscriptions: 50
  max_pending_bytes: 16MiB
  max_subscriptions_total: 1000
  max_subscription_memory: 1MiB
  max_pending_bytes_total: 64MiB
slow_consumer: {write_deadline_ms: 500, producer_stall_ms: 20, drain_timeout_ms: 1000}
auth:
  anonymous: true
  anonymous_permissions: {publish: {allow: ["a.>"]}}
multicast: {enabled: true, groups: 239.1.0.0/16, subjects: ["md.>"], threshold: 3, leave_below: 2,
            retransmit_window: 64}
metrics: {listen: "0.0.0.0:9500"}
admin: {socket: /run/x.sock}
logging: {level: debug, format: json, target: console}
)",
                    "b.yaml");
  ASSERT_TRUE(running && next) << (running ? next.error().message : running.error().message);
  const auto changed = diff(*running, *next);
  Config copied = *running;
  copy_live(*next, copied);
  std::set<std::string> live_changed, left;
  for (const auto& c : changed) {
    if (c.live) live_changed.insert(c.key);
  }
  EXPECT_GE(live_changed.size(), 14u);  // the file above changes (almost) every live key
  for (const auto& c : diff(*running, copied)) {
    EXPECT_TRUE(c.live) << c.key << " changed without a restart";
    left.insert(c.key);
  }
  EXPECT_EQ(left, live_changed);  // and every live change was taken
  // The workers' copy (BrokerOptions only) takes the same.
  BrokerOptions options = running->broker;
  copy_live(next->broker, options);
  EXPECT_EQ(options.max_pending_bytes_total, next->broker.max_pending_bytes_total);
  EXPECT_EQ(options.multicast.subjects, next->broker.multicast.subjects);
  EXPECT_EQ(options.buffer_size, running->broker.buffer_size);
  EXPECT_EQ(options.multicast.enabled, running->broker.multicast.enabled);
}

TEST(ConfigAuth, AnonymousIsOffUnlessTheConfigSaysSo) {
  auto c = parse("", "broker.yaml");
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->broker.auth.anonymous);
  EXPECT_TRUE(c->broker.auth.users.empty());
  auto on = parse("auth: {anonymous: true}\n", "broker.yaml");
  ASSERT_TRUE(on) << on.error().message;
  EXPECT_TRUE(on->broker.auth.anonymous);
}

TEST(ConfigAuth, UsersWithPermissionsAreRead) {
  auto c = parse(std::string(R"(
auth:
  anonymous: false
  anonymous_permissions:
    subscribe: {allow: ["public.>"]}
  users:
    - name: alice
      password: ")") +
                     kHash + R"("
      publish: {allow: ["orders.>"], deny: [orders.secret]}
      subscribe: {deny: ["orders.secret.>"]}
      streams: {read: {allow: [ORDERS, AUDIT], deny: [SECRET]}, join: {allow: [ORDERS.billing]}}
    - name: ingest
      token: ")" + kHash +
                     R"("
)",
                 "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  const auto& a = c->broker.auth;
  ASSERT_EQ(a.users.size(), 2u);
  EXPECT_EQ(a.users[0].name, "alice");
  EXPECT_EQ(a.users[0].password_hash, kHash);
  EXPECT_EQ(a.users[0].permissions.publish.allow, std::vector<std::string>{"orders.>"});
  EXPECT_EQ(a.users[0].permissions.publish.deny, std::vector<std::string>{"orders.secret"});
  EXPECT_EQ(a.users[0].permissions.subscribe.allow,
            std::vector<std::string>{">"});  // the default: everything
  EXPECT_EQ(a.users[0].permissions.streams.read.deny, std::vector<std::string>{"SECRET"});
  EXPECT_EQ(a.users[0].permissions.streams.join.allow, std::vector<std::string>{"ORDERS.billing"});
  // The defaults: every stream readable, no other user's durable consumer joined.
  EXPECT_EQ(a.users[1].permissions.streams.read.allow, std::vector<std::string>{">"});
  EXPECT_TRUE(a.users[1].permissions.streams.join.allow.empty());
  EXPECT_EQ(a.users[1].token_hash, kHash);
  EXPECT_TRUE(a.users[1].password_hash.empty());
  EXPECT_EQ(a.anonymous_permissions.subscribe.allow, std::vector<std::string>{"public.>"});
}

TEST(ConfigAuth, MistakesNameTheElementThatHasThem) {
  // A plain-text secret is refused: only hashes belong in the file.
  EXPECT_NE(errors_of("auth:\n  users:\n    - name: bob\n      password: hunter2\n")
                .find("broker.yaml:4:17: auth.users[0].password: expected a crypt(3) hash"),
            std::string::npos);
  EXPECT_NE(errors_of(std::string("auth:\n  users:\n    - name: bob\n      password: '") + kHash +
                      "'\n      publish: {allow: [ok, 'a..b']}\n")
                .find("broker.yaml:5:29: auth.users[0].publish.allow[1]: not a valid subject pattern"),
            std::string::npos);
  EXPECT_NE(errors_of(std::string("auth:\n  users:\n    - {name: bob, password: '") + kHash + "', token: '" +
                      kHash + "'}\n")
                .find("auth.users[0]: user 'bob' needs exactly one of password, token and certificate: true"),
            std::string::npos);
  EXPECT_NE(errors_of(std::string("auth:\n  users:\n    - {name: bob, password: '") + kHash +
                      "'}\n    - {name: bob, token: '" + kHash + "'}\n")
                .find("auth.users[1].name: duplicate user 'bob'"),
            std::string::npos);
  EXPECT_NE(errors_of(std::string("auth:\n  users:\n    - {name: bob, pasword: '") + kHash + "'}\n")
                .find("auth.users[0].pasword: unknown key"),
            std::string::npos);
  EXPECT_NE(errors_of("auth: {anonymous: maybe}\n").find("auth.anonymous: expected true or false"),
            std::string::npos);
  // Reading a stream once was subscribing to $RB.STREAM.<name>: such a rule
  // would now be void, so it is refused and the key that replaced it named.
  EXPECT_NE(
      errors_of("auth:\n  anonymous_permissions:\n    subscribe: {deny: [\"$RB.STREAM.SECRET\"]}\n")
          .find("auth.anonymous_permissions.subscribe: '$RB.STREAM.SECRET': which streams a user may read "
                "is streams.read"),
      std::string::npos);
  EXPECT_NE(errors_of("auth:\n  anonymous_permissions:\n    streams: {write: {allow: [A]}}\n")
                .find("streams.write: unknown key"),
            std::string::npos);
}

TEST(ConfigAuth, PermissionChangesAreLiveAndShowInTheDiff) {
  auto before =
      parse(std::string("auth:\n  users:\n    - {name: bob, password: '") + kHash + "'}\n", "broker.yaml");
  auto after = parse(std::string("auth:\n  users:\n    - {name: bob, password: '") + kHash +
                         "', subscribe: {allow: [a.>]}}\n",
                     "broker.yaml");
  ASSERT_TRUE(before && after);
  auto changes = diff(*before, *after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "auth.users");
  EXPECT_TRUE(changes[0].live);
  EXPECT_NE(changes[0].to.find("subscribe +a.>"), std::string::npos) << changes[0].to;
  EXPECT_EQ(changes[0].to.find(kHash), std::string::npos) << "a hash must not be logged";
}

// The example config the package installs and the one in the Kubernetes
// ConfigMap are what operators start from: both must load.
TEST(ConfigMulticast, SectionIsReadWithDefaultsOff) {
  auto d = parse("", "broker.yaml");
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->broker.multicast.enabled);
  EXPECT_EQ(d->broker.multicast.groups, "239.77.0.0/16");
  auto c = parse(R"(
multicast:
  enabled: true
  groups: 239.1.2.0/24
  subjects: ["prices.>", "news.*"]
  threshold: 8
  leave_below: 4
  retransmit_window: 1024
)",
                 "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  const auto& m = c->broker.multicast;
  EXPECT_TRUE(m.enabled);
  EXPECT_EQ(m.groups, "239.1.2.0/24");
  EXPECT_EQ(m.subjects, (std::vector<std::string>{"prices.>", "news.*"}));
  EXPECT_EQ(m.threshold, 8u);
  EXPECT_EQ(m.leave_below, 4u);
  EXPECT_EQ(m.retransmit_window, 1024u);
}

TEST(ConfigMulticast, MistakesNameTheKey) {
  EXPECT_NE(errors_of("multicast: {groups: 10.0.0.0/8}")
                .find("multicast.groups: '10.0.0.0/8' is not in the multicast range"),
            std::string::npos);
  EXPECT_NE(
      errors_of("multicast: {groups: 239.1.2.3}").find("multicast.groups: expected an IPv4 multicast range"),
      std::string::npos);
  EXPECT_NE(errors_of("multicast:\n  subjects: [\"a..b\"]")
                .find("broker.yaml:2:14: multicast.subjects[0]: not a valid subject pattern"),
            std::string::npos);
  EXPECT_NE(errors_of("multicast: {threshold: 2, leave_below: 3}")
                .find("multicast.leave_below: must not exceed multicast.threshold (2)"),
            std::string::npos);
  EXPECT_NE(
      errors_of("multicast: {retransmit_window: 4}").find("multicast.retransmit_window: must be between 16"),
      std::string::npos);
  EXPECT_NE(errors_of("multicast: {enabled: maybe}").find("multicast.enabled: expected true or false"),
            std::string::npos);
  EXPECT_NE(errors_of("multicast: {ttl: 3}").find("multicast.ttl: unknown key"), std::string::npos);
}

TEST(ConfigMulticast, SubjectsAndThresholdsChangeLiveTheRestNeedsARestart) {
  auto a = parse("multicast: {enabled: true, subjects: [\"a.>\"]}", "a.yaml");
  auto b = parse(
      "multicast: {enabled: true, subjects: [\"b.>\"], threshold: 4, leave_below: 2, groups: 239.9.0.0/16}",
      "b.yaml");
  ASSERT_TRUE(a && b);
  std::map<std::string, bool> live;
  for (const auto& ch : diff(*a, *b)) live[ch.key] = ch.live;
  EXPECT_EQ(live, (std::map<std::string, bool>{{"multicast.subjects", true},
                                               {"multicast.threshold", true},
                                               {"multicast.leave_below", true},
                                               {"multicast.groups", false}}));
}

TEST(Config, ShippedConfigsAreValid) {
  auto shipped = load(test::source_dir() + "/config/broker.yaml");
  ASSERT_TRUE(shipped) << shipped.error().message;
  EXPECT_EQ(shipped->broker.port, Config{}.broker.port);  // it documents the defaults
  EXPECT_FALSE(shipped->broker.auth.anonymous);

  // The broker.yaml embedded in a Kubernetes manifest (a ConfigMap's or a Secret's).
  auto embedded_config = [](const std::string& manifest) {
    std::ifstream k8s(test::source_dir() + "/deploy/kubernetes/" + manifest);
    EXPECT_TRUE(k8s) << manifest;
    std::string line, embedded;
    bool inside = false;
    while (std::getline(k8s, line)) {
      if (line.find("broker.yaml: |") != std::string::npos) {
        inside = true;
      } else if (inside && line.rfind("    ", 0) == 0) {
        embedded += line.substr(4) + "\n";
      } else if (inside && !line.empty()) {
        break;
      }
    }
    EXPECT_FALSE(embedded.empty()) << manifest;
    return parse(embedded, manifest);
  };
  auto cm = embedded_config("rdmabroker.yaml");
  ASSERT_TRUE(cm) << cm.error().message;
  EXPECT_EQ(cm->log.format, LogFormat::kJson);
  // Password logins over TCP only inside TLS; metrics on the pod's IP (a flag).
  EXPECT_EQ(cm->broker.tls.mode, TlsMode::kRequired);
  EXPECT_EQ(cm->broker.tls.certificate, "/etc/rdmabroker-tls/tls.crt");
  // The StatefulSet's: a cluster of three whose seed list names every pod.
  auto cluster = embedded_config("rdmabroker-cluster.yaml");
  ASSERT_TRUE(cluster) << cluster.error().message;
  EXPECT_EQ(cluster->broker.cluster.name, "prod");
  ASSERT_EQ(cluster->broker.cluster.routes.size(), 3u);
  EXPECT_EQ(cluster->broker.cluster.routes[2],
            "rdma://rdmabroker-2.rdmabroker-routes.rdmabroker.svc.cluster.local:7472");
  EXPECT_EQ(cluster->broker.cluster.listen_rdma_port, 7472) << "routes on a port of their own";
  // Both run the image scripts/image.sh builds, serve metrics on the pod's IP
  // (downward API), never on every interface of a hostNetwork node.
  for (const char* manifest : {"rdmabroker.yaml", "rdmabroker-cluster.yaml"}) {
    std::ifstream in(test::source_dir() + "/deploy/kubernetes/" + manifest);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("image: REGISTRY/rdmabroker:0.1.0   # scripts/image.sh"), std::string::npos)
        << manifest;
    EXPECT_NE(text.find("\"--metrics-listen\", \"$(POD_IP):9464\""), std::string::npos) << manifest;
    EXPECT_NE(text.find("fieldPath: status.podIP"), std::string::npos) << manifest;
    EXPECT_EQ(text.find("0.0.0.0:9464"), std::string::npos) << manifest;
  }
}

TEST(ConfigCluster, SectionIsReadAndItsRulesNameTheKey) {
  auto c = parse(R"(
cluster:
  name: prod-eu.1
  user: route
  password: s3cret
  routes: [rdma://broker-b:7470, tcp://broker-c]
)",
                 "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->broker.cluster.name, "prod-eu.1");
  EXPECT_EQ(c->broker.cluster.routes, (std::vector<std::string>{"rdma://broker-b:7470", "tcp://broker-c"}));
  auto fails_with = [](const std::string& yaml, const std::string& what) {
    auto r = parse(yaml, "broker.yaml");
    EXPECT_FALSE(r.ok()) << yaml;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
    }
  };
  fails_with("cluster: {name: 'a b', user: u, password: p}", "cluster.name");
  fails_with("cluster: {routes: [tcp://b]}", "routes need cluster.name");
  fails_with("cluster: {name: prod, user: u}", "cluster.password");
  fails_with("cluster: {name: prod, user: u, password: p, routes: [http://b]}",
             "expected rdma://host[:port]");
  fails_with("cluster: {name: prod, user: u, password: p, routes: [tcp://b:0]}", "bad port");
  fails_with("cluster: {name: prod, user: u, password: p, routes: ['tcp://:7471']}", "no host");
  fails_with("cluster: {name: prod, user: u, password: p, routes: ['tcp://u:pw@b']}", "no credentials");
  // Routes pass what they bring to multicast channels too (docs/cluster.md).
  auto with_multicast =
      parse("cluster: {name: prod, user: u, password: p}\nmulticast: {enabled: true}", "b.yaml");
  ASSERT_TRUE(with_multicast) << with_multicast.error().message;
  EXPECT_TRUE(with_multicast->broker.multicast.enabled);
  // Route listeners: a cluster's, on ports of their own.
  fails_with("cluster: {listen_tcp: '0.0.0.0:7473'}", "a route listener needs cluster.name");
  fails_with("cluster: {name: prod, user: u, password: p, listen_tcp: '0.0.0.0:7471'}",
             "cluster.listen_tcp: port 7471 is listen.tcp's");
  fails_with("cluster: {name: prod, user: u, password: p, listen_rdma: '0.0.0.0:7470'}",
             "cluster.listen_rdma: port 7470 is listen.rdma's");
  fails_with("cluster: {name: prod, user: u, password: p, listen_rdma: 'nowhere'}", "cluster.listen_rdma");
  auto listeners = parse(
      "cluster: {name: prod, user: u, password: p, listen_rdma: '10.0.0.1:7472', "
      "listen_tcp: '0.0.0.0:7473'}",
      "broker.yaml");
  ASSERT_TRUE(listeners) << listeners.error().message;
  EXPECT_EQ(listeners->broker.cluster.listen_rdma_address, "10.0.0.1");
  EXPECT_EQ(listeners->broker.cluster.listen_rdma_port, 7472);
  EXPECT_EQ(listeners->broker.cluster.listen_tcp_port, 7473);
  EXPECT_TRUE(listeners->broker.cluster.has_route_listener());
  EXPECT_FALSE(c->broker.cluster.has_route_listener()) << "none by default: routes use the client ports";
  // Gossip: what this broker announces, as a route login and a client can use it.
  auto announced = parse(
      "cluster: {name: prod, user: u, password: p, advertise: [rdma://10.0.0.1:7472, tcp://a.example:7473], "
      "client_advertise: [rdma://10.0.0.1, tls://a.example:7471]}",
      "broker.yaml");
  ASSERT_TRUE(announced) << announced.error().message;
  EXPECT_EQ(announced->broker.cluster.advertise,
            (std::vector<std::string>{"rdma://10.0.0.1:7472", "tcp://a.example:7473"}));
  EXPECT_EQ(announced->broker.cluster.client_advertise,
            (std::vector<std::string>{"rdma://10.0.0.1", "tls://a.example:7471"}));
  EXPECT_EQ(show(*announced, "cluster.advertise"), "[rdma://10.0.0.1:7472, tcp://a.example:7473]");
  fails_with("cluster: {advertise: [tcp://a:7473]}", "announcing routes needs cluster.name");
  fails_with("cluster: {client_advertise: [tcp://a:7471]}", "announcing to clients needs cluster.name");
  fails_with("cluster: {name: prod, user: u, password: p, advertise: [tls://a:7471]}",
             "expected rdma://host[:port] or tcp://host[:port]");
  fails_with("cluster: {name: prod, user: u, password: p, client_advertise: [http://a]}",
             "expected rdma://, tcp:// or tls://");
  fails_with("cluster: {name: prod, user: u, password: p, client_advertise: ['tcp://u:pw@a']}",
             "no credentials in an announced URL");
  fails_with("cluster: {name: prod, user: u, password: p, advertise: ['tcp://a..b:7473']}", "as a subject");
  fails_with("cluster: {name: prod, user: u, password: p, advertise: [tcp://" + std::string(240, 'h') + "]}",
             "announce fewer");
  EXPECT_EQ(show(*listeners, "cluster.listen_tcp"), "0.0.0.0:7473");
  // The password is never shown, and only the route list may change live.
  EXPECT_EQ(show(*c, "cluster.password"), "(set)");
  auto next = *c;
  next.broker.cluster.routes.push_back("tcp://broker-d");
  next.broker.cluster.name = "other";
  const auto changes = diff(*c, next);
  ASSERT_EQ(changes.size(), 2u);
  for (const auto& ch : changes) EXPECT_EQ(ch.live, ch.key == "cluster.routes") << ch.key;
}

TEST(ConfigTls, SectionIsReadAndItsRulesNameTheKey) {
  auto c = parse(R"(
tls:
  mode: required
  certificate: /etc/rdmabroker/tls/broker.crt
  key: /etc/rdmabroker/tls/broker.key
  client_ca: /etc/rdmabroker/tls/ca.crt
  min_version: "1.3"
auth:
  users:
    - {name: svc-a, certificate: true, publish: {allow: ["a.>"]}}
)",
                 "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  const auto& t = c->broker.tls;
  EXPECT_EQ(t.mode, TlsMode::kRequired);
  EXPECT_EQ(t.certificate, "/etc/rdmabroker/tls/broker.crt");
  EXPECT_EQ(t.key, "/etc/rdmabroker/tls/broker.key");
  EXPECT_EQ(t.client_ca, "/etc/rdmabroker/tls/ca.crt");
  EXPECT_EQ(t.min_version, "1.3");
  ASSERT_EQ(c->broker.auth.users.size(), 1u);
  EXPECT_TRUE(c->broker.auth.users[0].certificate);
  EXPECT_TRUE(c->broker.auth.users[0].password_hash.empty());

  EXPECT_NE(errors_of("tls: {mode: required}")
                .find("tls.certificate: tls.mode is required: a certificate is needed"),
            std::string::npos);
  EXPECT_NE(errors_of("tls: {mode: optional, certificate: a.crt}").find("tls.key: tls.mode is optional"),
            std::string::npos);
  EXPECT_NE(errors_of("tls: {mode: on}").find("tls.mode: expected one of off, optional, required, got 'on'"),
            std::string::npos);
  EXPECT_NE(errors_of("tls: {min_version: \"1.1\"}").find("tls.min_version: expected one of 1.2, 1.3"),
            std::string::npos);
  EXPECT_NE(errors_of("listen: {tcp: \"\"}\ntls: {mode: required, certificate: a, key: b}")
                .find("tls.mode: TLS is served on the TCP listener, and listen.tcp is empty"),
            std::string::npos);
  EXPECT_NE(errors_of("auth:\n  users:\n    - {name: svc, certificate: true}")
                .find("auth.users: user 'svc' logs in with a client certificate, which needs tls.client_ca"),
            std::string::npos);
  EXPECT_NE(errors_of("auth:\n  users:\n    - {name: svc, certificate: false}")
                .find("auth.users[0].certificate: expected true"),
            std::string::npos);
  EXPECT_NE(errors_of("auth:\n  users:\n    - {name: svc, certificate: true, token: x}")
                .find("needs exactly one of password, token and certificate: true"),
            std::string::npos);
}

TEST(ConfigTls, EveryTlsKeyChangesLive) {
  auto a = parse("tls: {mode: optional, certificate: a.crt, key: a.key}", "a.yaml");
  auto b =
      parse("tls: {mode: required, certificate: b.crt, key: b.key, client_ca: ca.crt, min_version: \"1.3\"}",
            "b.yaml");
  ASSERT_TRUE(a && b) << (a ? b.error().message : a.error().message);
  std::map<std::string, bool> live;
  for (const auto& ch : diff(*a, *b)) live[ch.key] = ch.live;
  EXPECT_EQ(live, (std::map<std::string, bool>{{"tls.mode", true},
                                               {"tls.certificate", true},
                                               {"tls.key", true},
                                               {"tls.client_ca", true},
                                               {"tls.min_version", true}}));
}

}  // namespace
}  // namespace rdmabroker::config
