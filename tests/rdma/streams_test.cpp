// SPDX-License-Identifier: Apache-2.0
// Streams (docs/streams.md) as an operator runs them, over RDMA (in the
// guest, label rdma) and TCP (on the host, label tcp): what is published on
// a stream's subjects is stored in order, headers kept, and still there
// after a restart, while subscribers get every message as before and other
// subjects are untouched; retention, new and removed streams follow a
// reload; a full disk refuses (counted) without stopping anything else, and
// the stream takes messages again once there is room.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness.hpp"
#include "rdmabroker/client.hpp"
#include "stream_files.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class Streams : public StreamTest {
 protected:
  /// `rdmabroker reload`: its exit code and output (stderr too: the refusal).
  std::pair<int, std::string> reload(const std::string& streams) {
    write_config(streams);
    return run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker_->admin_socket() + " 2>&1"});
  }
  std::int64_t stat(const std::string& key) { return broker_->stats()[key]; }
  /// Waits until every statistic in `expected` holds at once: the broker's
  /// statistics are read one by one, so a reading taken while the stream
  /// engine refreshes can show one stream's (or one value's) new state beside
  /// another's old one; what the test then asserts is what it waited for.
  std::map<std::string, std::int64_t> wait_for(const std::map<std::string, std::int64_t>& expected) {
    return broker_->wait_stats(
        [&](auto& s) {
          return std::all_of(expected.begin(), expected.end(),
                             [&](const auto& kv) { return s[kv.first] == kv.second; });
        },
        20s);
  }
  /// Every message of stream `name`: "subject payload" each (and the header blocks into `headers`).
  std::vector<std::string> stored(const std::string& name, std::vector<std::string>* headers = nullptr) {
    std::vector<std::string> out;
    for (const auto& m : read_stream(data_ + "/" + name)) {
      out.push_back(m.subject + " " + m.payload);
      if (headers) headers->push_back(m.headers);
    }
    return out;
  }
};

TEST_P(Streams, PublishedMessagesAreStoredInOrderAndStillThereAfterARestart) {
  start("  - name: ORDERS\n    subjects: [\"orders.>\"]\n");
  auto sub = connect_via(*broker_, GetParam());
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub && pub);
  std::atomic<int> got{0};
  ASSERT_TRUE(sub->subscribe("orders.>", [&](const Message&) { ++got; }));
  ASSERT_TRUE(sub->flush(10s));
  constexpr int kMessages = 400;
  std::vector<std::string> sent;
  for (int i = 0; i < kMessages; ++i) {
    const std::string subject = i % 2 ? "orders.eu" : "orders.us";
    const std::string payload = "order " + std::to_string(i);
    if (i % 10 == 0) {
      ASSERT_TRUE(pub->publish(subject, Headers{{"Msg-Id", "id-" + std::to_string(i)}}, payload));
    } else {
      ASSERT_TRUE(pub->publish(subject, payload));
    }
    ASSERT_TRUE(pub->publish("other.x", "not for the stream"));
    sent.push_back(subject + " " + payload);
  }
  ASSERT_TRUE(pub->flush(10s));
  auto s = wait_for({{"stream.ORDERS.messages", kMessages}, {"stream.ORDERS.last_sequence", kMessages}});
  EXPECT_EQ(s["stream.ORDERS.messages"], kMessages);
  EXPECT_EQ(s["stream.ORDERS.last_sequence"], kMessages);
  EXPECT_EQ(s["streams.count"], 1);
  // The stream takes nothing from the subscribers.
  for (int i = 0; i < 200 && got < kMessages; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(got, kMessages);
  sub.reset();
  pub.reset();

  start("  - name: ORDERS\n    subjects: [\"orders.>\"]\n");
  s = broker_->stats();
  EXPECT_EQ(s["stream.ORDERS.messages"], kMessages);
  EXPECT_EQ(s["stream.ORDERS.first_sequence"], 1);
  EXPECT_EQ(s["stream.ORDERS.corrupt_records"], 0);
  pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("orders.eu", "after the restart"));
  ASSERT_TRUE(pub->flush(10s));
  EXPECT_EQ(wait_for({{"stream.ORDERS.last_sequence", kMessages + 1}})["stream.ORDERS.last_sequence"],
            kMessages + 1);
  pub.reset();
  broker_.reset();

  sent.push_back("orders.eu after the restart");
  std::vector<std::string> headers;
  EXPECT_EQ(stored("ORDERS", &headers), sent);
  ASSERT_EQ(headers.size(), sent.size());
  EXPECT_NE(headers[10].find("id-10"), std::string::npos);
  EXPECT_TRUE(headers[11].empty());
}

TEST_P(Streams, RetentionAndTheStreamsThemselvesFollowAReload) {
  start("  - name: A\n    subjects: [\"a.>\"]\n    max_msgs: 100\n");
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(pub);
  for (int i = 1; i <= 300; ++i) ASSERT_TRUE(pub->publish("a.x", std::to_string(i)));
  ASSERT_TRUE(pub->flush(10s));
  auto s = wait_for({{"stream.A.last_sequence", 300},
                     {"stream.A.messages", 100},
                     {"stream.A.first_sequence", 201},
                     {"stream.A.removed_by_limits", 200}});
  EXPECT_EQ(s["stream.A.messages"], 100);
  EXPECT_EQ(s["stream.A.first_sequence"], 201);
  EXPECT_EQ(s["stream.A.removed_by_limits"], 200);

  // A lower limit applies at once, with new subjects in the same reload; a
  // new stream starts capturing.
  auto [rc, out] = reload(
      "  - name: A\n    subjects: [\"a.>\", \"also.a\"]\n    max_msgs: 50\n"
      "  - name: KV\n    subjects: [\"kv.>\"]\n    max_msgs_per_subject: 1\n");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(
      wait_for({{"stream.A.messages", 50}, {"stream.A.first_sequence", 251}})["stream.A.first_sequence"],
      251);
  ASSERT_TRUE(pub->publish("also.a", "301"));
  for (const char* key : {"kv.a", "kv.b", "kv.a", "kv.a", "kv.b"}) ASSERT_TRUE(pub->publish(key, "v"));
  ASSERT_TRUE(pub->flush(10s));
  s = wait_for({{"stream.KV.last_sequence", 5}, {"stream.KV.messages", 2}, {"stream.A.last_sequence", 301}});
  EXPECT_EQ(s["stream.A.last_sequence"], 301) << "the subject the reload added";
  EXPECT_EQ(s["stream.KV.messages"], 2) << "the last of each key";
  EXPECT_EQ(s["streams.count"], 2);

  // Subjects that overlap another stream's: refused, nothing changes.
  std::tie(rc, out) = reload(
      "  - name: A\n    subjects: [\"a.>\", \"also.a\"]\n    max_msgs: 50\n"
      "  - name: KV\n    subjects: [\"kv.>\", \"a.x\"]\n");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("overlaps 'a.>' of stream 'A'"), std::string::npos) << out;

  // A removed stream stops capturing; its files stay.
  std::tie(rc, out) = reload("  - name: KV\n    subjects: [\"kv.>\"]\n    max_msgs_per_subject: 1\n");
  ASSERT_EQ(rc, 0) << out;
  s = wait_for({{"streams.count", 1}});
  EXPECT_EQ(s.count("stream.A.messages"), 0u);
  ASSERT_TRUE(pub->publish("a.x", "after removal"));
  ASSERT_TRUE(pub->publish("kv.c", "v"));
  ASSERT_TRUE(pub->flush(10s));
  EXPECT_EQ(wait_for({{"stream.KV.last_sequence", 6}, {"stream.KV.messages", 3}})["stream.KV.messages"], 3);
  pub.reset();
  broker_.reset();
  const auto a = stored("A");
  ASSERT_EQ(a.size(), 301u)
      << "the files of a removed stream are kept whole (no limits applied to them here)";
  EXPECT_EQ(a.back(), "also.a 301");
}

// A full disk, for real: a 512 KiB tmpfs under the stream's directory, in a
// mount namespace the broker inherits (root: CI, and the guest).
TEST_P(Streams, AFullDiskRefusesCountedOthersFlowAndTheStreamResumesWithRoom) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root (CI and the guest have it)";
  ASSERT_NO_FATAL_FAILURE(mount_small_disk("512k"));
  write_file(data_ + "/filler", std::string(128 << 10, 'f'));
  start("  - name: DISK\n    subjects: [\"disk.>\"]\n", "  sync: always\n");
  auto sub = connect_via(*broker_, GetParam());
  auto pub = connect_via(*broker_, GetParam());
  ASSERT_TRUE(sub && pub);
  std::atomic<int> others{0};
  ASSERT_TRUE(sub->subscribe("other", [&](const Message&) { ++others; }));
  ASSERT_TRUE(sub->flush(10s));
  const std::string payload(4000, 'p');
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(pub->publish("disk.x", payload));
    ASSERT_TRUE(pub->publish("other", "flows"));
  }
  ASSERT_TRUE(pub->flush(10s));
  auto s = broker_->wait_stats(
      [](auto& s) { return s["stream.DISK.stored"] + s["stream.DISK.refused_disk_full"] == 200; }, 20s);
  EXPECT_GT(s["stream.DISK.refused_disk_full"], 0);
  EXPECT_GT(s["stream.DISK.stored"], 10);
  EXPECT_EQ(s["stream.DISK.messages"], s["stream.DISK.stored"]);
  for (int i = 0; i < 200 && others < 200; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(others, 200) << "a subject without a stream is not held up by a full disk";
  const auto kept = s["stream.DISK.stored"];

  // One that asks is told why.
  auto acked = pub->publish_acked("disk.x", payload, 10s);
  ASSERT_FALSE(acked);
  EXPECT_EQ(acked.error().kind, ErrorKind::kDiskFull) << acked.error().message;

  fs::remove(data_ + "/filler");
  auto room = pub->publish_acked("disk.x", "room again", 10s);
  ASSERT_TRUE(room) << room.error().message;
  EXPECT_EQ(room->sequence, static_cast<std::uint64_t>(kept + 1));
  sub.reset();
  pub.reset();
  broker_.reset();
  const auto all = stored("DISK");
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kept + 1));
  EXPECT_EQ(all.back(), "disk.x room again");
}

/// The names of process `pid`'s threads (/proc/PID/task/*/comm).
std::multiset<std::string> thread_names(int pid) {
  std::multiset<std::string> names;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    if (std::getline(in, name)) names.insert(name);
  }
  return names;
}

TEST_P(Streams, EveryThreadOfTheBrokerAndOfTheLibraryHasItsName) {
  // What an operator reads in `top -H` or perf: which part of the broker is busy.
  start("  - name: ORDERS\n    subjects: [\"orders.>\"]\n", "", "workers: 2\n");
  auto client = connect_via(*broker_, GetParam());
  ASSERT_TRUE(client);
  const auto broker = thread_names(broker_->pid());
  // The main thread keeps the program's name (so does a sanitizer's own thread).
  EXPECT_GE(broker.count("rdmabrokerd"), 1u) << ::testing::PrintToString(broker);
  for (const char* name : {"rb-worker-0", "rb-worker-1", "rb-auth", "rb-streams"}) {
    EXPECT_EQ(broker.count(name), 1u) << name << " in " << ::testing::PrintToString(broker);
  }
  if (GetParam() == Via::kRdma) {
    EXPECT_EQ(broker.count("rb-accept"), 1u) << ::testing::PrintToString(broker);
  }
  EXPECT_GE(thread_names(::getpid()).count("rb-client-io"), 1u);
}

TEST(StreamsConfig, AStreamThatCannotBeOpenedStopsTheStartWithItsName) {
  const std::string config = "/tmp/rdmabroker-streams-bad-" + std::to_string(getpid()) + ".yaml";
  write_file(config,
             "rdma: off\nstorage:\n  directory: /proc/version/streams\nstreams:\n"
             "  - name: ORDERS\n    subjects: [\"orders.>\"]\n");
  auto [rc, out] = run({broker_path(), "--config", config, "--tcp-port", std::to_string(next_port()),
                        "--admin-socket", "", "--metrics-listen", ""});
  ::unlink(config.c_str());
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("stream ORDERS"), std::string::npos) << out;
  EXPECT_NE(out.find("/proc/version/streams/ORDERS"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Via, Streams, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kRdma ? "rdma" : "tcp"; });

}  // namespace
}  // namespace rdmabroker::test
