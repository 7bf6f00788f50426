// SPDX-License-Identifier: Apache-2.0
// Streams held to the rules that protect live traffic (docs/security.md,
// "Streams"), over RDMA (in the guest) and TCP (on the host): every message
// a consumer delivers passes its user's subscribe permissions, as a live
// delivery would, and a reload that narrows them applies to open consumers
// at once; a consumer of a stream its user may not read is refused; a
// durable consumer belongs to the user that made it, across restarts, and
// another joins it only where streams.join grants it; only the broker
// publishes on its own `$RB.` subjects; a stream may not take them.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/consumer.hpp"
#include "stream_files.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

ClientOptions as(const std::string& user) {
  ClientOptions o;
  o.user = user;
  o.password = user + "-pw";
  return o;
}

class Tenants : public StreamTest {
 protected:
  /// alice may receive everything but orders.secret.> (and `alice_extra`
  /// more rules), bob everything, carol only other.>, dave everything but
  /// may read no stream; anonymous clients everything. `bob_joins`: bob's
  /// streams.join.
  std::string users(const std::string& alice_deny = "[\"orders.secret.>\"]",
                    const std::string& bob_joins = "[]", const std::string& alice_streams = "[\">\"]") {
    std::string y = "auth:\n  anonymous: true\n  users:\n";
    const auto user = [&](const std::string& name, const std::string& rest) {
      // Hashed once: a reload that changes a user's hash revokes its connections.
      auto [hash, fresh] = hashes_.try_emplace(name);
      if (fresh) hash->second = hash_secret(name + "-pw");
      y += "    - name: " + name + "\n      password: '" + hash->second + "'\n" + rest;
    };
    user("alice", "      subscribe: {allow: [\">\"], deny: " + alice_deny +
                      "}\n      streams: {read: {allow: " + alice_streams + "}}\n");
    user("bob", "      streams: {join: {allow: " + bob_joins + "}}\n");
    user("carol", "      subscribe: {allow: [\"other.>\"]}\n");
    user("dave", "      streams: {read: {deny: [ORDERS]}}\n");
    return y;
  }
  void start_with(const std::string& auth) {
    start("  - {name: ORDERS, subjects: [\"orders.>\"]}\n", "", auth);
  }
  /// Rewrites the configuration with `auth` and reloads it; the CLI's exit code.
  int reload(const std::string& auth) {
    write_config("  - {name: ORDERS, subjects: [\"orders.>\"]}\n", "", auth);
    return run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker_->admin_socket() + " 2>&1"})
        .first;
  }
  void publish(Client& c, const std::string& subject, const std::string& text) {
    ASSERT_TRUE(c.publish_acked(subject, text, 10s)) << subject;
  }
  /// The subjects `k` delivers within `quiet` of the last, acknowledged.
  std::vector<std::string> drain(Consumer& k, std::chrono::milliseconds quiet = 500ms) {
    std::vector<std::string> out;
    while (auto m = k.next(quiet)) {
      out.push_back(m->subject + "=" + std::string(m->data()));
      EXPECT_TRUE(k.ack(*m));
    }
    return out;
  }
  std::map<std::string, std::string> hashes_;
};

TEST_P(Tenants, AConsumerDeliversOnlyWhatItsUserMayReceiveAndAReloadNarrowsItAtOnce) {
  start_with(users());
  auto bob = connect_via(*broker_, GetParam(), as("bob"));
  auto alice = connect_via(*broker_, GetParam(), as("alice"));
  ASSERT_TRUE(bob && alice);
  publish(*bob, "orders.x", "1");
  publish(*bob, "orders.secret.x", "top secret");
  publish(*bob, "orders.x", "3");

  // The live subscription is refused, and so is every way round it: the
  // stream's history, as an ephemeral or a durable consumer.
  auto live = alice->subscribe("orders.secret.x");
  ASSERT_TRUE(live);
  auto refused = (*live)->next(10s);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("denied"), std::string::npos) << refused.error().message;
  auto k = alice->consume("ORDERS", {}, 10s);
  ASSERT_TRUE(k) << k.error().message;
  EXPECT_EQ(drain(**k), (std::vector<std::string>{"orders.x=1", "orders.x=3"}));
  auto d =
      alice->consume("ORDERS", {.durable = "audit", .start = ConsumerOptions::Start::kLastPerSubject}, 10s);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(drain(**d), (std::vector<std::string>{"orders.x=3"}));
  EXPECT_EQ(broker_->wait_stats([](auto& s) { return s["stream.ORDERS.consumer_denied"] == 2; },
                                10s)["stream.ORDERS.consumer_denied"],
            2)
      << "each consumer passed the secret message over once, counted";

  // A user that may receive no subject of the stream, or may not read the
  // stream: refused, typed, for that consumer alone.
  auto carol = connect_via(*broker_, GetParam(), as("carol"));
  auto dave = connect_via(*broker_, GetParam(), as("dave"));
  ASSERT_TRUE(carol && dave);
  auto none = carol->consume("ORDERS", {}, 10s);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(none.error().message.find("may receive no subject of stream ORDERS"), std::string::npos)
      << none.error().message;
  auto unread = dave->consume("ORDERS", {}, 10s);
  ASSERT_FALSE(unread);
  EXPECT_EQ(unread.error().kind, ErrorKind::kPermissionDenied) << unread.error().message;
  publish(*dave, "orders.dave", "still served");

  // A reload that denies alice orders.y.> applies to her open consumers from
  // the next message on.
  ASSERT_EQ(reload(users("[\"orders.secret.>\", \"orders.y.>\"]")), 0);
  publish(*bob, "orders.y.1", "now denied");
  publish(*bob, "orders.x", "5");
  EXPECT_EQ(drain(**k), (std::vector<std::string>{"orders.dave=still served", "orders.x=5"}));

  // One that takes ORDERS out of her streams.read ends her consumers.
  ASSERT_EQ(reload(users("[]", "[]", "[OTHER]")), 0);
  auto gone = (*k)->next(10s);
  ASSERT_FALSE(gone);
  EXPECT_NE(gone.error().message.find("consumer of stream 'ORDERS' revoked"), std::string::npos)
      << gone.error().message;
  publish(*alice, "orders.alice", "her connection is still hers");
}

TEST_P(Tenants, ADurableConsumerBelongsToItsCreatorAndAnotherJoinsOnlyByGrant) {
  start_with(users());
  auto alice = connect_via(*broker_, GetParam(), as("alice"));
  auto bob = connect_via(*broker_, GetParam(), as("bob"));
  auto anonymous = connect_via(*broker_, GetParam());
  ASSERT_TRUE(alice && bob && anonymous);
  for (int i = 1; i <= 4; ++i) publish(*bob, "orders.x", std::to_string(i));
  {
    auto billing = alice->consume("ORDERS", {.durable = "billing"}, 10s);
    ASSERT_TRUE(billing) << billing.error().message;
    auto m = (*billing)->next(10s);
    ASSERT_TRUE(m);
    ASSERT_TRUE((*billing)->ack(*m));
    ASSERT_TRUE(alice->flush(10s));
  }
  for (Client* other : {bob.get(), anonymous.get()}) {
    // Not as a member, and not with settings that would take alice's messages from her.
    auto taken = other->consume("ORDERS", {.durable = "billing", .ack_wait = 1ms, .max_deliver = 1}, 10s);
    ASSERT_FALSE(taken);
    EXPECT_EQ(taken.error().kind, ErrorKind::kPermissionDenied);
    EXPECT_NE(taken.error().message.find("belongs to user 'alice'"), std::string::npos)
        << taken.error().message;
  }
  auto own = bob->consume("ORDERS", {.durable = "bobs"}, 10s);
  ASSERT_TRUE(own) << "a durable of his own: " << own.error().message;
  own->reset();

  // The owner is kept with the consumer's state, across a restart.
  broker_.reset();
  const auto file = nlohmann::json::parse(std::ifstream(data_ + "/ORDERS/consumers/billing.json"));
  EXPECT_EQ(file.at("owner"), "alice");
  start_with(users());
  bob = connect_via(*broker_, GetParam(), as("bob"));
  ASSERT_TRUE(bob);
  auto still = bob->consume("ORDERS", {.durable = "billing"}, 10s);
  ASSERT_FALSE(still);
  EXPECT_EQ(still.error().kind, ErrorKind::kPermissionDenied) << still.error().message;

  // streams.join grants bob the consumer: he takes what alice left.
  ASSERT_EQ(reload(users("[\"orders.secret.>\"]", "[\"ORDERS.billing\"]")), 0);
  auto joined = bob->consume("ORDERS", {.durable = "billing"}, 10s);
  ASSERT_TRUE(joined) << joined.error().message;
  EXPECT_EQ(drain(**joined), (std::vector<std::string>{"orders.x=2", "orders.x=3", "orders.x=4"}));
}

TEST_P(Tenants, OnlyTheBrokerPublishesOnItsOwnSubjectsAndNoStreamTakesThem) {
  start_with(users());
  auto bob = connect_via(*broker_, GetParam(), as("bob"));
  auto watcher = connect_via(*broker_, GetParam());
  ASSERT_TRUE(bob && watcher);
  auto advisories = watcher->subscribe("$RB.>");
  ASSERT_TRUE(advisories);
  ASSERT_TRUE(watcher->flush(10s));
  for (const char* forged : {"$RB.ADVISORY.MAX_DELIVERIES.ORDERS.billing", "$RB.STREAM.ORDERS"}) {
    auto r = bob->publish_acked(forged, "{\"stream\":\"ORDERS\"}", 10s);
    ASSERT_FALSE(r) << forged;
    EXPECT_EQ(r.error().kind, ErrorKind::kPermissionDenied) << forged;
  }
  ASSERT_TRUE(bob->publish("$RB.ADVISORY.X", "forged"));  // refused with an ERROR, not relayed
  ASSERT_TRUE(bob->flush(10s));
  EXPECT_FALSE((*advisories)->next(300ms)) << "no client's message reaches $RB. subscribers";
  publish(*bob, "orders.x", "the publisher is still served");

  // `stream add` checks every setting against its range, and the subjects.
  const auto add = [&](const std::string& args) {
    return run(
        {"/bin/sh", "-c",
         cli_path() + " stream add X " + args + " --admin-socket " + broker_->admin_socket() + " 2>&1"});
  };
  for (const char* bad : {"--subjects '$RB.>'", "--subjects '_INBOX.>'", "--subjects '>'",
                          "--subjects 'x.>' --max-age 10000000000000"}) {
    auto [rc, out] = add(bad);
    EXPECT_NE(rc, 0) << bad << ": " << out;
  }
  auto [rc, out] = add("--subjects 'x.>'");
  EXPECT_EQ(rc, 0) << out;
}

// A flood of distinct Msg-Ids costs a bounded amount of memory: ids longer
// than 128 bytes are refused (typed), and a stream remembers at most
// duplicate_ids_max of them, the oldest forgotten first, counted.
TEST_P(Tenants, MsgIdsAreBoundedInLengthAndInCount) {
  start("  - {name: SMALL, subjects: [\"small.>\"], max_msgs: 100, duplicate_ids_max: 500}\n", "",
        "auth: {anonymous: true}\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  auto long_id =
      c->publish_acked("small.x", Headers{{"Msg-Id", std::string(129, 'x')}}, as_payload("m"), 10s);
  ASSERT_FALSE(long_id);
  EXPECT_EQ(long_id.error().kind, ErrorKind::kInvalidArgument) << long_id.error().message;
  EXPECT_NE(long_id.error().message.find("at most 128 bytes"), std::string::npos) << long_id.error().message;
  ASSERT_TRUE(c->publish_acked("small.x", Headers{{"Msg-Id", std::string(128, 'x')}}, as_payload("m"), 10s));

  std::atomic<int> failed{0}, answered{0};
  constexpr int kIds = 3000;
  for (int i = 0; i < kIds; ++i) {
    const std::string id = "flood-" + std::to_string(i) + std::string(100, '.');
    ASSERT_TRUE(
        c->publish_acked_async("small.x", Headers{{"Msg-Id", id}}, as_payload("m"), [&](Result<PubAck> r) {
          if (!r) failed.fetch_add(1);
          answered.fetch_add(1);
        }));
  }
  ASSERT_TRUE(c->flush(30s));
  const auto s = broker_->wait_stats(
      [](auto& s) { return s["stream.SMALL.acks"] == kIds + 2 && s["stream.SMALL.duplicate_ids"] == 500; },
      30s);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(s.at("stream.SMALL.refused_msg_id"), 1);
  EXPECT_EQ(s.at("stream.SMALL.duplicate_ids"), 500);
  EXPECT_EQ(s.at("stream.SMALL.duplicate_ids_evicted"), kIds + 1 - 500);
  // An id still remembered is recognised; one forgotten early is stored again.
  auto again = c->publish_acked("small.x", Headers{{"Msg-Id", "flood-2999" + std::string(100, '.')}},
                                as_payload("m"), 10s);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->duplicate);
}

// Consumers are bounded: per stream, per owner and broker-wide (a typed
// refusal past each), in how fast one connection opens them, and in how
// long a durable one without members is kept.
TEST_P(Tenants, ConsumersAreBoundedInNumberInRateAndInTheirIdleLife) {
  start("  - {name: A, subjects: [\"a.>\"]}\n  - {name: B, subjects: [\"b.>\"]}\n", "",
        "auth: {anonymous: true}\nlimits: {max_consumers_per_stream: 4, max_durables_per_user: 5, "
        "consumer_opens_per_second: 20, consumer_inactive_threshold_s: 1}\n");
  auto c = connect_via(*broker_, GetParam());
  ASSERT_TRUE(c);
  const auto refused = [&](const std::string& stream, const std::string& durable, const std::string& limit) {
    auto r = c->consume(stream, {.durable = durable}, 10s);
    ASSERT_FALSE(r) << stream << "/" << durable;
    EXPECT_NE(r.error().message.find(limit), std::string::npos) << r.error().message;
  };
  std::vector<std::shared_ptr<Consumer>> open;
  for (int i = 0; i < 4; ++i) {
    auto k = c->consume("A", {.durable = "a" + std::to_string(i)}, 10s);
    ASSERT_TRUE(k) << i << ": " << k.error().message;
    open.push_back(*k);
  }
  refused("A", "a4", "limits.max_consumers_per_stream");
  auto b0 = c->consume("B", {.durable = "b0"}, 10s);
  ASSERT_TRUE(b0) << b0.error().message;
  refused("B", "b1", "limits.max_durables_per_user");
  auto ephemeral = c->consume("B", {}, 10s);
  EXPECT_TRUE(ephemeral) << "an ephemeral consumer is no durable one: " << ephemeral.error().message;

  // A flood of CONSUMEs from one connection is held to its rate.
  int rate_refusals = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = c->consume("B", {}, 10s);
    if (!r && r.error().message.find("limits.consumer_opens_per_second") != std::string::npos)
      ++rate_refusals;
  }
  EXPECT_GT(rate_refusals, 0);
  EXPECT_GE(broker_->stats()["limits.refused.consumer_opens"], rate_refusals);

  // Durable consumers without a member for consumer_inactive_threshold_s go, files and all.
  open.clear();
  b0->reset();
  ASSERT_TRUE(c->flush(10s));
  const auto s = broker_->wait_stats(
      [](auto& s) { return s["stream.A.consumers_expired"] == 4 && s["stream.B.consumers_expired"] == 1; },
      15s);
  EXPECT_EQ(s.at("stream.A.consumers_expired"), 4);
  EXPECT_FALSE(std::filesystem::exists(data_ + "/A/consumers/a0.json"));
  auto again = c->consume("A", {.durable = "a4"}, 10s);
  EXPECT_TRUE(again) << "room again: " << again.error().message;
}

// The duplicate window does not depend on the messages still being in the
// stream: a Msg-Id whose message retention or a purge removed is still
// recognised for its window, across a broker killed with SIGKILL.
TEST_P(Tenants, ARetryIsRecognisedAfterRetentionAPurgeAndARestart) {
  const std::string streams = "  - {name: D, subjects: [\"d.>\"], max_msgs: 1}\n";
  start(streams, "", "auth: {anonymous: true}\n");
  const auto publish = [&](const std::string& id) {
    auto c = connect_via(*broker_, GetParam());
    EXPECT_TRUE(c);
    auto r = c->publish_acked("d.x", Headers{{"Msg-Id", id}}, as_payload(id), 10s);
    EXPECT_TRUE(r) << id << ": " << (r ? "" : r.error().message);
    return r ? *r : PubAck{};
  };
  const PubAck a = publish("a");
  EXPECT_FALSE(a.duplicate);
  EXPECT_FALSE(publish("b").duplicate);  // max_msgs 1: a's message is removed
  ASSERT_EQ(broker_->restart(SIGKILL), 128 + SIGKILL);
  PubAck again = publish("a");
  EXPECT_TRUE(again.duplicate) << "a's message was removed by retention before the crash";
  EXPECT_EQ(again.sequence, a.sequence);

  auto [rc, out] = run(
      {"/bin/sh", "-c", cli_path() + " stream purge D --admin-socket " + broker_->admin_socket() + " 2>&1"});
  ASSERT_EQ(rc, 0) << out;
  ASSERT_EQ(broker_->restart(SIGKILL), 128 + SIGKILL);
  EXPECT_TRUE(publish("b").duplicate) << "b's message was purged before the crash";
  EXPECT_TRUE(publish("a").duplicate);
  EXPECT_FALSE(publish("c").duplicate);
}

INSTANTIATE_TEST_SUITE_P(Via, Tenants, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kRdma ? "rdma" : "tcp"; });

}  // namespace
}  // namespace rdmabroker::test
