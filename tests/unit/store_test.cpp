// SPDX-License-Identifier: Apache-2.0
// A stream's message store (daemon/store/): records and their CRC, segment
// files, retention, purge, and what open() does with a directory a crash,
// a flipped bit or a full disk left behind.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "store/crc32c.hpp"
#include "store/file_store.hpp"

namespace rdmabroker::daemon::store {
namespace {

namespace fs = std::filesystem;

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}
std::string text_of(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

constexpr std::int64_t kSecond = 1'000'000'000;

class Store : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmabroker-store-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<FileStore> open(StoreLimits limits = {}, std::uint64_t segment_bytes = 4096,
                                  RecoveryReport* report = nullptr, std::int64_t now = 100 * kSecond) {
    auto s = FileStore::open({dir_, segment_bytes, limits}, now, report);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(s.value()) : nullptr;
  }
  static std::uint64_t put(FileStore& s, std::string_view subject, std::string_view payload,
                           std::int64_t now = 100 * kSecond, std::string_view headers = {}) {
    auto r = s.append({subject, bytes_of(headers), bytes_of(payload)}, now);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? r.value() : 0;
  }
  static std::string get(FileStore& s, std::uint64_t seq) {
    std::vector<std::byte> buf(1 << 16);
    auto r = s.read(seq, buf);
    return r.ok() ? std::string(r->subject) + " " + text_of(r->payload) : "<" + r.error().message + ">";
  }
  std::vector<fs::path> segment_files() const {
    std::vector<fs::path> out;
    for (const auto& f : fs::directory_iterator(dir_)) {
      if (f.path().extension() == ".seg") out.push_back(f.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string dir_;
};

TEST(Crc32c, IsTheCastagnoliChecksum) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  // Continuable: in two parts as in one.
  EXPECT_EQ(crc32c(bytes_of("56789"), crc32c(bytes_of("1234"))), 0xE3069283u);
}

TEST(Record, ParsesWhatWasEncodedAndRejectsAFlippedBitOrATornEnd) {
  const std::string headers = "RB01h", payload = "the payload";
  const MessageParts m{"orders.eu", bytes_of(headers), bytes_of(payload)};
  const auto h = encode_header(7, 42, m);
  std::vector<std::byte> rec(h.begin(), h.end());
  for (auto part : {bytes_of(m.subject), m.headers, m.payload})
    rec.insert(rec.end(), part.begin(), part.end());
  ASSERT_EQ(rec.size(), record_length(m));
  RecordView r;
  std::size_t length = 0;
  ASSERT_EQ(parse_record(rec, r, length), ParseOutcome::kOk);
  EXPECT_EQ(length, rec.size());
  EXPECT_EQ(r.sequence, 7u);
  EXPECT_EQ(r.time_ns, 42);
  EXPECT_EQ(r.subject, "orders.eu");
  EXPECT_EQ(text_of(r.headers), headers);
  EXPECT_EQ(text_of(r.payload), payload);
  EXPECT_EQ(parse_record(std::span(rec).first(rec.size() - 1), r, length), ParseOutcome::kShort);
  EXPECT_EQ(parse_record(std::span(rec).first(10), r, length), ParseOutcome::kShort);
  for (std::size_t i : {std::size_t{9}, std::size_t{20}, rec.size() - 1}) {
    auto bad = rec;
    bad[i] ^= std::byte{0x10};
    EXPECT_EQ(parse_record(bad, r, length), ParseOutcome::kBad) << "byte " << i;
  }
}

TEST_F(Store, MessagesComeBackInOrderWithTheirHeadersAndAfterAReopen) {
  {
    auto s = open();
    EXPECT_EQ(put(*s, "a.b", "one", 5 * kSecond, "HDR"), 1u);
    EXPECT_EQ(put(*s, "a.c", "two", 6 * kSecond), 2u);
    // A clock that steps back: receive times never go backwards in a stream.
    EXPECT_EQ(put(*s, "a.b", "three", 4 * kSecond), 3u);
    std::vector<std::byte> buf(256);
    auto r = s->read(1, buf);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(text_of(r->headers), "HDR");
    EXPECT_EQ(s->read(3, buf)->time_ns, 6 * kSecond);
    std::vector<std::byte> tiny(8);
    auto small = s->read(2, tiny);
    ASSERT_FALSE(small.ok());
    EXPECT_EQ(small.error().code, StoreErrc::kTooSmall);
    EXPECT_EQ(small.error().needed, *s->length_of(2));
    EXPECT_EQ(s->read(4, buf).error().code, StoreErrc::kNotFound);
    ASSERT_TRUE(s->sync().ok());
    EXPECT_EQ(s->stats().durable_sequence, 3u);
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  RecoveryReport report;
  auto s = open({}, 4096, &report);
  EXPECT_EQ(report.records, 3u);
  EXPECT_TRUE(report.problems.empty());
  EXPECT_EQ(get(*s, 1), "a.b one");
  EXPECT_EQ(get(*s, 2), "a.c two");
  EXPECT_EQ(get(*s, 3), "a.b three");
  EXPECT_EQ(put(*s, "a.d", "four"), 4u);
  const auto st = s->stats();
  EXPECT_EQ(st.messages, 4u);
  EXPECT_EQ(st.first_sequence, 1u);
  EXPECT_EQ(st.last_sequence, 4u);
  EXPECT_EQ(st.subjects, 3u);
  // Storage overhead: the 32-byte record header beside subject, headers and payload.
  EXPECT_EQ(st.bytes, 4 * kRecordHeaderBytes + (3 + 3 + 3) + (3 + 3) + (3 + 5) + (3 + 4));
}

TEST_F(Store, SegmentsRollAtTheirSizeAndALargeMessageTakesOneOfItsOwn) {
  auto s = open({}, 1024);
  const std::string kb(900, 'x');
  for (int i = 0; i < 5; ++i) put(*s, "big", kb);
  put(*s, "huge", std::string(5000, 'y'));
  put(*s, "small", "z");
  EXPECT_EQ(segment_files().size(), 7u);
  EXPECT_EQ(s->stats().segments, 7u);
  EXPECT_EQ(get(*s, 6).size(), 5u + 5000);
  EXPECT_EQ(get(*s, 7), "small z");
  EXPECT_EQ(segment_files()[5].filename(), "00000000000000000006.seg");
}

// A failed fdatasync reports its error once: a later one of the same file
// succeeds without proving anything for what was written before. So when
// the sync of the segment a roll leaves fails, the next sync() fails too
// (once), and the durable sequence does not pass what was in doubt until a
// sync after it succeeds.
TEST_F(Store, ASyncThatFailedAtARollIsReportedByTheNextSync) {
  int fail = 0;  // syncs still to fail
  FileStoreOptions options{dir_, 1024, {}, [&] { return fail > 0 && fail-- > 0; }};
  auto opened = FileStore::open(options, 0);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  FileStore& s = *opened.value();
  const std::string kb(900, 'x');
  put(s, "a", kb);
  ASSERT_TRUE(s.sync().ok());
  EXPECT_EQ(s.stats().durable_sequence, 1u);
  fail = 1;
  auto rolled = s.append({"b", {}, bytes_of(kb)}, 0);  // does not fit: the segment of 1 rolls
  ASSERT_FALSE(rolled.ok()) << "the roll's sync failed";
  EXPECT_EQ(rolled.error().code, StoreErrc::kIo);
  EXPECT_NE(rolled.error().message.find("fault sync-fail"), std::string::npos) << rolled.error().message;
  auto reported = s.sync();
  ASSERT_FALSE(reported.ok()) << "the roll's failure is the next sync's";
  EXPECT_EQ(reported.error().code, StoreErrc::kIo);
  EXPECT_EQ(s.stats().durable_sequence, 1u);
  EXPECT_EQ(put(s, "c", kb), 2u) << "the store goes on";
  auto synced = s.sync();
  ASSERT_TRUE(synced.ok()) << synced.error().message;
  EXPECT_EQ(synced.value(), 2u);
  EXPECT_EQ(s.stats().durable_sequence, 2u);
}

TEST_F(Store, CountAndByteLimitsDropTheOldestAndWholeSegmentsGo) {
  StoreLimits limits;
  limits.max_msgs = 10;
  auto s = open(limits, 512);
  for (int i = 1; i <= 40; ++i) put(*s, "s", "message " + std::to_string(i));
  auto st = s->stats();
  EXPECT_EQ(st.messages, 10u);
  EXPECT_EQ(st.first_sequence, 31u);
  EXPECT_EQ(st.removed_by_limits, 30u);
  EXPECT_EQ(get(*s, 30), "<no message 30>");
  EXPECT_EQ(get(*s, 31), "s message 31");
  // Only the segments that still hold a live message are left on disk.
  EXPECT_LE(segment_files().size(), 2u);
  EXPECT_EQ(segment_files().size(), st.segments);

  limits.max_msgs = 0;
  limits.max_bytes = 3 * (kRecordHeaderBytes + 1 + 10);  // three of "message NN"
  s->set_limits(limits);
  st = s->stats();
  EXPECT_EQ(st.messages, 3u);
  EXPECT_EQ(st.first_sequence, 38u);
}

TEST_F(Store, DiscardNewRefusesWhenFullAndTooLargeIsRefusedAlways) {
  StoreLimits limits;
  limits.max_msgs = 3;
  limits.discard = Discard::kNew;
  limits.max_msg_size = 100;
  auto s = open(limits);
  for (int i = 0; i < 3; ++i) put(*s, "s", "m");
  auto full = s->append({"s", {}, bytes_of("m")}, 0);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, StoreErrc::kFull);
  auto large = s->append({"t", {}, bytes_of(std::string(101, 'x'))}, 0);
  ASSERT_FALSE(large.ok());
  EXPECT_EQ(large.error().code, StoreErrc::kTooLarge);
  EXPECT_EQ(s->stats().messages, 3u);
  EXPECT_EQ(s->stats().last_sequence, 3u) << "a refused message takes no sequence";
}

TEST_F(Store, PerSubjectLimitKeepsTheLastNOfEachAndSurvivesAReopen) {
  StoreLimits limits;
  limits.max_msgs_per_subject = 1;
  {
    auto s = open(limits);
    put(*s, "kv.a", "1");
    put(*s, "kv.b", "1");
    put(*s, "kv.a", "2");
    put(*s, "kv.c", "1");
    put(*s, "kv.a", "3");
    EXPECT_EQ(s->last_per_subject(), (std::vector<std::uint64_t>{2, 4, 5}));
    EXPECT_EQ(s->last_per_subject("kv.a"), std::vector<std::uint64_t>{5});
    EXPECT_TRUE(s->last_per_subject("kv.none").empty());
    EXPECT_EQ(s->stats().messages, 3u);
    EXPECT_EQ(s->next_live(1), 2u);
    EXPECT_EQ(s->next_live(3), 4u);
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  // Nothing about deletions was written: open() applies the limit again.
  auto s = open(limits);
  EXPECT_EQ(s->stats().messages, 3u);
  EXPECT_EQ(get(*s, 1), "<no message 1>");
  EXPECT_EQ(get(*s, 5), "kv.a 3");
  // Raising the limit later keeps what is there; lowering it applies at once.
  limits.max_msgs_per_subject = 2;
  s->set_limits(limits);
  put(*s, "kv.b", "2");
  put(*s, "kv.b", "3");
  EXPECT_EQ(s->last_per_subject("kv.b"), std::vector<std::uint64_t>{7});
  EXPECT_EQ(s->stats().messages, 4u);  // a:5, c:4, b:6,7
}

TEST_F(Store, AgeLimitExpiresTheOldestAndTimeFindsItsFirstMessage) {
  StoreLimits limits;
  limits.max_age_ns = 10 * kSecond;
  auto s = open(limits, 256);
  for (int i = 0; i < 20; ++i) put(*s, "t", "at " + std::to_string(i), i * kSecond);
  EXPECT_EQ(s->first_at_time(5 * kSecond), 6u);
  EXPECT_EQ(s->first_at_time(static_cast<std::int64_t>(5.5 * kSecond)), 7u);
  EXPECT_FALSE(s->first_at_time(30 * kSecond).has_value());
  EXPECT_EQ(s->expire(25 * kSecond), 15u);  // received before 15 s: at 0..14, sequences 1..15
  EXPECT_EQ(s->stats().first_sequence, 16u);
  EXPECT_EQ(s->first_at_time(0), 16u);
  EXPECT_EQ(s->expire(25 * kSecond), 0u);
}

TEST_F(Store, APurgeRemovesEverythingAndSequencesGoOnAfterAReopen) {
  {
    auto s = open({}, 256);
    for (int i = 0; i < 10; ++i) put(*s, "p", "m");
    auto purged = s->purge();
    ASSERT_TRUE(purged.ok());
    EXPECT_EQ(purged.value(), 10u);
    EXPECT_TRUE(segment_files().empty());
    EXPECT_EQ(s->stats().first_sequence, 11u);
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  auto s = open({}, 256);
  EXPECT_EQ(s->stats().messages, 0u);
  EXPECT_EQ(put(*s, "p", "after"), 11u);
  EXPECT_EQ(get(*s, 11), "p after");
}

TEST_F(Store, ATornTailIsCutOffAndReportedAndTheStoreGoesOn) {
  {
    auto s = open();
    for (int i = 1; i <= 3; ++i) put(*s, "w", "whole " + std::to_string(i));
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  const auto file = segment_files().back();
  const auto whole = fs::file_size(file);
  {
    // Half of a fourth record, as a crash in the middle of its write leaves it.
    auto s = open();
    put(*s, "w", "the fourth, torn");
  }
  fs::resize_file(file, whole + 20);
  RecoveryReport report;
  auto s = open({}, 4096, &report);
  EXPECT_EQ(report.torn_bytes, 20u);
  ASSERT_EQ(report.problems.size(), 2u);
  EXPECT_NE(report.problems[0].find("unfinished write"), std::string::npos) << report.problems[0];
  EXPECT_NE(report.problems[1].find("goes on at 1048580"), std::string::npos) << report.problems[1];
  EXPECT_EQ(fs::file_size(file), whole);
  EXPECT_EQ(s->stats().messages, 3u);
  EXPECT_EQ(s->stats().torn_bytes, 20u);
  // Sequence 4 may have been seen before the crash (a consumer reads what
  // is written before it is synced): it is never given to another message.
  // The store goes on after its reservation (FileStoreOptions::reserve).
  EXPECT_EQ(put(*s, "w", "four again"), 4u + (1u << 20));
  EXPECT_EQ(get(*s, 4), "<no message 4>");
  EXPECT_EQ(get(*s, 4 + (1u << 20)), "w four again");
}

TEST_F(Store, NoSequenceIsGivenTwiceAfterACrashWhateverTheFilesLost) {
  {
    auto s = open();
    for (int i = 1; i <= 5; ++i) put(*s, "w", std::to_string(i));
    // A crash: no close(). Even with every segment file lost, the
    // reservation in meta.json says how far sequences may have gone.
  }
  for (const auto& f : segment_files()) fs::remove(f);
  {
    auto s = open();
    EXPECT_EQ(put(*s, "w", "after"), 1u + (1u << 20));
    ASSERT_TRUE(s->close().ok());
  }
  auto s = open();
  EXPECT_EQ(put(*s, "w", "next"), 2u + (1u << 20)) << "a clean close gives the reservation back";
}

// Found by fuzzing (tests/fuzz/regressions/fuzz_store): a segment whose
// records run past the next segment's first sequence made one sequence live
// in two files, and a read looked in the other one.
TEST_F(Store, ASegmentHoldsOnlyTheSequencesBeforeTheNextOnesName) {
  {
    auto s = open();
    for (int i = 1; i <= 6; ++i) put(*s, "w", std::to_string(i));
    ASSERT_TRUE(s->close().ok());
  }
  std::ofstream(dir_ + "/00000000000000000004.seg").flush();  // an empty newer segment named 4
  RecoveryReport report;
  auto s = open({}, 4096, &report);
  EXPECT_EQ(report.corrupt_records, 3u) << "4..6 in the first file are beyond its range";
  EXPECT_EQ(s->stats().messages, 3u);
  std::vector<std::byte> buf(256);
  for (auto q = s->next_live(1); q; q = s->next_live(*q + 1)) EXPECT_TRUE(s->read(*q, buf).ok()) << *q;
}

TEST_F(Store, AFileTheBrokerDidNotWriteIsRefusedAtOpenAndNeverModified) {
  {
    auto s = open();
    for (int i = 1; i <= 3; ++i) put(*s, "w", std::to_string(i));
    ASSERT_TRUE(s->close().ok());
  }
  // Random bytes named like the next segment.
  const std::string foreign = dir_ + "/00000000000000000500.seg";
  std::string junk(4000, '\0');
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(foreign, std::ios::binary) << junk;
  auto refused = FileStore::open({dir_, 4096, {}}, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, StoreErrc::kCorrupt);
  EXPECT_NE(refused.error().message.find(foreign + " holds no record this broker wrote"), std::string::npos)
      << refused.error().message;
  EXPECT_EQ(fs::file_size(foreign), junk.size()) << "never modified";
  fs::remove(foreign);

  // Sequences near the top of the range: damage, refused naming the file.
  std::ofstream(dir_ + "/meta.json") << "{\"first_sequence\": 18446744073709551615}";
  auto top = FileStore::open({dir_, 4096, {}}, 0);
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.error().message.find("meta.json names sequence 18446744073709551615"), std::string::npos)
      << top.error().message;
  fs::remove(dir_ + "/meta.json");
  std::ofstream(dir_ + "/18446744073709551000.seg") << "x";
  auto named = FileStore::open({dir_, 4096, {}}, 0);
  ASSERT_FALSE(named.ok());
  EXPECT_NE(named.error().message.find("18446744073709551000.seg is named for sequence"), std::string::npos)
      << named.error().message;
}

TEST_F(Store, AFlippedByteIsFoundAtOpenOrOnReadAndTheRestIsServed) {
  {
    auto s = open({}, 200);
    for (int i = 1; i <= 12; ++i) put(*s, "f", "message " + std::to_string(i));
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  // Damage the second record of the first segment (sequence 2).
  const auto first = segment_files().front();
  const std::size_t second = kRecordHeaderBytes + 1 + 9;
  {
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(second + kRecordHeaderBytes + 3));
    f.put('#');
  }
  RecoveryReport report;
  auto s = open({}, 200, &report);
  EXPECT_EQ(report.corrupt_records, 1u);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("CRC"), std::string::npos);
  EXPECT_EQ(s->stats().messages, 11u);
  EXPECT_EQ(get(*s, 1), "f message 1");
  EXPECT_EQ(get(*s, 2), "<no message 2>");
  EXPECT_EQ(get(*s, 3), "f message 3");
  EXPECT_EQ(get(*s, 12), "f message 12");

  // Damage found by a read: reported once, skipped from then on.
  const auto last = segment_files().back();
  {
    std::fstream f(last, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kRecordHeaderBytes + 2);
    f.put('#');
  }
  const std::uint64_t victim = Segment::first_sequence_of(last.filename().string());
  std::vector<std::byte> buf(256);
  auto r = s->read(victim, buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, StoreErrc::kCorrupt);
  EXPECT_EQ(s->read(victim, buf).error().code, StoreErrc::kNotFound);
  EXPECT_EQ(s->stats().corrupt_records, 2u);
  EXPECT_EQ(s->stats().messages, 10u);
}

TEST_F(Store, ADamagedMetaFileStopsTheOpenRatherThanBringBackPurgedMessages) {
  {
    auto s = open();
    put(*s, "m", "1");
    ASSERT_TRUE(s->purge().ok());
  }
  std::ofstream(dir_ + "/meta.json") << "{\"first_seq";
  auto s = FileStore::open({dir_, 4096, {}}, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, StoreErrc::kCorrupt);
  EXPECT_NE(s.error().message.find("meta.json"), std::string::npos);
}

[[noreturn]] void child_fails(const std::string& why) {
  std::cerr << why << "\n";
  std::_Exit(1);
}

// A full disk, for real: a 256 KiB tmpfs at `dir` in a mount namespace of
// a child process (the test runs as root in CI; elsewhere a user namespace
// grants it), 64 KiB of it taken by the file returned (removed: space
// returns).
std::string mount_small_disk(const std::string& dir) {
  if (::unshare(CLONE_NEWNS | (::geteuid() == 0 ? 0 : CLONE_NEWUSER)) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) {
    child_fails(std::string("no mount namespace here: ") + std::strerror(errno));
  }
  const std::string filler = dir + "/filler";
  std::ofstream(filler) << std::string(64 << 10, 'f');
  return filler;
}

// Reopened, the store at `dir`/stream holds `messages` and nothing torn or damaged.
void reopen_finds(const std::string& dir, const StoreLimits& limits, std::uint64_t messages,
                  const char* why) {
  RecoveryReport report;
  auto reopened = FileStore::open({dir + "/stream", 1 << 20, limits}, 0, &report);
  if (!reopened.ok() || report.torn_bytes != 0 || report.corrupt_records != 0 ||
      reopened.value()->stats().messages != messages) {
    child_fails(why);
  }
}

void fill_the_disk_then_free_it(const std::string& dir, const StoreLimits& limits) {
  const std::string filler = mount_small_disk(dir);
  auto s = std::move(FileStore::open({dir + "/stream", 1 << 20, limits}, 0).value());
  const std::string payload(4000, 'p');
  std::uint64_t stored = 0;
  for (;;) {
    auto r = s->append({"disk", {}, bytes_of(payload)}, 0);
    if (r.ok()) {
      stored = r.value();
      continue;
    }
    if (r.error().code != StoreErrc::kDiskFull) child_fails("not a full disk: " + r.error().message);
    break;
  }
  if (stored < 10) child_fails("the disk filled too early");
  if (s->stats().messages != stored || s->stats().last_sequence != stored)
    child_fails("a refused message was counted");
  // Space returns: the next message is stored, after the last one.
  fs::remove(filler);
  auto again = s->append({"disk", {}, bytes_of("back")}, 0);
  if (!again.ok() || again.value() != stored + 1) child_fails("no message after space returned");
  s.reset();
  reopen_finds(dir, limits, stored + 1, "the refused writes left something behind");
  std::_Exit(0);
}

TEST_F(Store, AFullDiskRefusesWithItsOwnErrorAndTakesMessagesWhenSpaceReturns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fill_the_disk_then_free_it(dir_, {}), ::testing::ExitedWithCode(0), "");
}

TEST_F(Store, AFullDiskRefusesAndRecoversWhenEachRecordIsWrittenThrough) {
  // discard: new with a per-subject limit writes each record as it comes.
  StoreLimits limits;
  limits.discard = Discard::kNew;
  limits.max_msgs_per_subject = 1000;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fill_the_disk_then_free_it(dir_, limits), ::testing::ExitedWithCode(0), "");
}

// The stream engine stages a batch and writes it with one flush(): the same
// disk filling up, a batch at a time. Of a batch that does not fit, what
// was written whole is stored and the rest is not: its sequences are taken
// again once space returns, and nothing of it is left in the files.
void fill_the_disk_by_batches_then_free_it(const std::string& dir) {
  const std::string filler = mount_small_disk(dir);
  auto s = std::move(FileStore::open({dir + "/stream", 1 << 20, {}}, 0).value());
  const std::string payload(4000, 'p');
  const auto batch = [&](std::uint64_t expect_first) -> StoreStatus {
    for (std::uint64_t i = 0; i < 8; ++i) {
      auto r = s->stage({"disk", {}, bytes_of(payload)}, 0);
      if (!r.ok() || r.value() != expect_first + i) child_fails("staging refused or out of order");
    }
    return s->flush();
  };
  std::uint64_t next = 1;
  for (;;) {
    auto r = batch(next);
    if (!r.ok()) {
      if (r.error().code != StoreErrc::kDiskFull) child_fails("not a full disk: " + r.error().message);
      if (r.error().lost_from < next || r.error().lost_from >= next + 8)
        child_fails("the lost part starts at " + std::to_string(r.error().lost_from));
      next = r.error().lost_from;
      break;
    }
    next += 8;
  }
  if (next < 10) child_fails("the disk filled too early");
  if (s->stats().messages != next - 1 || s->stats().last_sequence != next - 1)
    child_fails("a batch that was not written was counted");
  fs::remove(filler);
  if (!batch(next).ok()) child_fails("no batch after space returned");
  std::vector<std::byte> buf(8192);
  auto last = s->read(next + 7, buf);
  if (!last.ok() || last->sequence != next + 7) child_fails("the batch after space returned is not readable");
  s.reset();
  reopen_finds(dir, {}, next + 7, "the refused batch left something behind");
  std::_Exit(0);
}

TEST_F(Store, WhatABatchCouldNotWriteIsNotStoredAndItsSequencesComeAgain) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fill_the_disk_by_batches_then_free_it(dir_), ::testing::ExitedWithCode(0), "");
}

TEST_F(Store, ReadsInAndOutOfOrderSeeEveryRecordAsWrittenWhileTheStreamGrows) {
  // Small records come through a read-ahead window: reading ahead of what
  // was appended since, backwards, and across segments must still see each
  // record exactly as written.
  auto s = open({}, 64 * 1024);
  const auto text = [](std::uint64_t q) { return "record " + std::to_string(q) + std::string(q % 97, '.'); };
  std::uint64_t last = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 100; ++i) last = put(*s, "r", text(last + 1));
    for (std::uint64_t q = 1; q <= last; q += 7) ASSERT_EQ(get(*s, q), "r " + text(q)) << q;
    ASSERT_EQ(get(*s, last), "r " + text(last));
  }
  for (std::uint64_t q = last; q >= 1; --q) ASSERT_EQ(get(*s, q), "r " + text(q)) << q;
  put(*s, "big", std::string(10000, 'b'));
  EXPECT_EQ(get(*s, last + 1), "big " + std::string(10000, 'b'));
  EXPECT_GT(s->stats().segments, 2u);
}

TEST_F(Store, StagedMessagesAreWrittenByOneFlushAcrossSegmentsAndTheLimitsApplyThen) {
  StoreLimits limits;
  limits.max_msgs = 5;
  std::vector<std::string> payloads;  // staged bytes stay valid until flush()
  for (int i = 1; i <= 12; ++i) payloads.push_back("message " + std::to_string(i) + std::string(300, '.'));
  {
    auto s = open(limits, 1024);
    for (int i = 0; i < 12; ++i) {
      auto r = s->stage({"s", {}, bytes_of(payloads[i])}, 100 * kSecond);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r.value(), static_cast<std::uint64_t>(i + 1));
    }
    ASSERT_TRUE(s->flush().ok());
    const auto st = s->stats();
    EXPECT_EQ(st.messages, 5u);
    EXPECT_EQ(st.first_sequence, 8u);
    EXPECT_EQ(st.last_sequence, 12u);
    EXPECT_EQ(get(*s, 7), "<no message 7>");
    EXPECT_EQ(get(*s, 12), "s " + payloads[11]);
    EXPECT_EQ(segment_files().size(), st.segments);
    ASSERT_TRUE(s->close().ok());  // an orderly end: the next open goes on at the next sequence
  }
  RecoveryReport report;
  auto s = open(limits, 1024, &report);
  EXPECT_TRUE(report.problems.empty());
  EXPECT_EQ(s->stats().messages, 5u);
  EXPECT_EQ(get(*s, 8), "s " + payloads[7]);
}

}  // namespace
}  // namespace rdmabroker::daemon::store
