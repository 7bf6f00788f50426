// SPDX-License-Identifier: Apache-2.0
// The storage and streams settings (docs/configuration.md, "storage and
// streams"): read with their defaults, every mistake named at its element,
// and which changes are live.
#include <gtest/gtest.h>

#include <map>

#include "rdmabroker/config/config.hpp"
#include "unit/config_errors.hpp"

namespace rdmabroker::config {
namespace {

TEST(ConfigStreams, StreamsAndStorageAreReadWithTheirDefaults) {
  auto none = parse("", "broker.yaml");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->broker.streams.empty());
  EXPECT_EQ(none->broker.storage.directory, "/var/lib/rdmabroker/streams");
  EXPECT_EQ(none->broker.storage.sync, StreamSync::kGroup);
  EXPECT_EQ(none->broker.storage.sync_interval_ms, 10u);

  auto c = parse(
      "storage: {directory: /data, sync: always, sync_interval_ms: 50}\n"
      "streams:\n"
      "  - name: ORDERS\n"
      "    subjects: [\"orders.>\", \"returns.*\"]\n"
      "    max_msgs: 1000\n    max_bytes: 1GiB\n    max_age_s: 3600\n"
      "    max_msgs_per_subject: 2\n    max_msg_size: 64KiB\n    discard: new\n"
      "  - name: kv_1\n    subjects: [prices]\n",
      "broker.yaml");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->broker.storage.directory, "/data");
  EXPECT_EQ(c->broker.storage.sync, StreamSync::kAlways);
  EXPECT_EQ(c->broker.storage.sync_interval_ms, 50u);
  auto interval = parse("storage: {sync: interval}\n", "broker.yaml");
  ASSERT_TRUE(interval) << interval.error().message;
  EXPECT_EQ(interval->broker.storage.sync, StreamSync::kInterval);
  ASSERT_EQ(c->broker.streams.size(), 2u);
  const auto& s = c->broker.streams[0];
  EXPECT_EQ(s.name, "ORDERS");
  EXPECT_EQ(s.subjects, (std::vector<std::string>{"orders.>", "returns.*"}));
  EXPECT_EQ(s.max_msgs, 1000u);
  EXPECT_EQ(s.max_bytes, 1u << 30);
  EXPECT_EQ(s.max_age_s, 3600u);
  EXPECT_EQ(s.max_msgs_per_subject, 2u);
  EXPECT_EQ(s.max_msg_size, 64u << 10);
  EXPECT_EQ(s.discard, StreamDiscard::kNew);
  EXPECT_EQ(c->broker.streams[1].discard, StreamDiscard::kOld);
  EXPECT_EQ(c->broker.streams[1].max_msgs, 0u);
}

TEST(ConfigStreams, MistakesNameTheStreamElementThatHasThem) {
  EXPECT_EQ(errors_of("streams: {name: A}\n"),
            "broker.yaml:1:10: streams: expected a list of streams (- name: ..., subjects: [...])");
  EXPECT_EQ(
      errors_of("streams:\n  - name: \"a b\"\n    subjects: [x]\n"),
      "broker.yaml:2:11: streams[0].name: every stream needs a name of 1..64 letters, digits, '_' or '-'");
  EXPECT_EQ(errors_of("streams:\n  - name: A\n"),
            "broker.yaml:2:5: streams[0].subjects: stream 'A' needs subjects");
  EXPECT_EQ(
      errors_of("streams:\n  - name: A\n    subjects: [\"a..b\"]\n"),
      "broker.yaml:3:16: streams[0].subjects[0]: not a valid subject pattern (docs/subjects.md): 'a..b'");
  EXPECT_EQ(
      errors_of("streams:\n  - name: A\n    subjects: [a]\n    max_bytes: lots\n"),
      "broker.yaml:4:16: streams[0].max_bytes: expected a size (bytes, or with KiB/MiB/GiB) between 0 and "
      "1125899906842624, got 'lots'");
  EXPECT_EQ(errors_of("streams:\n  - name: A\n    subjects: [a]\n    discard: oldest\n"),
            "broker.yaml:4:14: streams[0].discard: expected old or new");
  EXPECT_EQ(errors_of("streams:\n  - name: A\n    subjects: [a]\n    max_mgs: 3\n"),
            "broker.yaml:4:5: streams[0].max_mgs: unknown key");
  EXPECT_EQ(errors_of("streams:\n  - {name: A, subjects: [a]}\n  - {name: A, subjects: [b]}\n"),
            "broker.yaml:3:12: streams[1].name: duplicate stream 'A'");
  EXPECT_EQ(errors_of("streams:\n  - {name: A, subjects: [\"orders.*.new\"]}\n"
                      "  - {name: B, subjects: [x, \"orders.eu.>\"]}\n"),
            "broker.yaml:3:25: streams[1].subjects: 'orders.eu.>' overlaps 'orders.*.new' of stream 'A': a "
            "subject belongs to one stream at most");
  // Reserved subjects and ranges (config::check_stream, which `stream add` applies too).
  EXPECT_EQ(errors_of("streams:\n  - {name: A, subjects: [\"$RB.>\"]}\n"),
            "broker.yaml:2:5: streams[0]: '$RB.>' takes subjects of $RB.>, which no stream may: $RB. is the "
            "broker's own, _INBOX. carries replies");
  EXPECT_NE(errors_of("streams:\n  - {name: A, subjects: [\">\"]}\n").find("'>' takes subjects of $RB.>"),
            std::string::npos);
  EXPECT_NE(errors_of("streams:\n  - {name: A, subjects: [\"_INBOX.*\"]}\n").find("_INBOX.>"),
            std::string::npos);
  EXPECT_EQ(errors_of("streams:\n  - {name: A, subjects: [a], duplicate_window_s: 1000000}\n"),
            "broker.yaml:2:5: streams[0]: duplicate_window_s must be between 0 and 604800, got 1000000");
  EXPECT_NE(errors_of("streams:\n  - {name: A, subjects: [a], max_age_s: 1000000000000}\n")
                .find("max_age_s must be between 0 and 3153600000"),
            std::string::npos);
  config::StreamSettings ok{.name = "A", .subjects = {"a.>"}};
  EXPECT_FALSE(check_stream(ok));
  ok.max_msg_size = std::uint64_t{1} << 31;
  EXPECT_EQ(check_stream(ok), "max_msg_size must be between 0 and 1073741824, got 2147483648");
  EXPECT_EQ(errors_of("storage: {sync: sometimes}\n"),
            "broker.yaml:1:17: storage.sync: expected one of group, always, interval, got 'sometimes'");
}

TEST(ConfigStreams, StreamsAndTheSyncPolicyChangeLiveTheDirectoryNeedsARestart) {
  auto a = parse("streams: [{name: A, subjects: [a]}]\n", "a.yaml");
  auto b = parse(
      "storage: {directory: /elsewhere, sync: always, sync_interval_ms: 5}\n"
      "streams: [{name: A, subjects: [a], max_msgs: 5}, {name: B, subjects: [b]}]\n",
      "b.yaml");
  ASSERT_TRUE(a && b);
  std::map<std::string, bool> live;
  for (const auto& ch : diff(*a, *b)) live[ch.key] = ch.live;
  EXPECT_EQ(live, (std::map<std::string, bool>{{"storage.directory", false},
                                               {"storage.sync", true},
                                               {"storage.sync_interval_ms", true},
                                               {"streams", true}}));
  Config running = *a;
  copy_live(*b, running);
  EXPECT_EQ(running.broker.streams, b->broker.streams);
  EXPECT_EQ(running.broker.storage.directory, a->broker.storage.directory);
}

}  // namespace
}  // namespace rdmabroker::config
