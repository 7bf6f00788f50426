// SPDX-License-Identifier: Apache-2.0
// A stream's messages in segment files in a directory of their own
// (docs/streams.md, "Storage"): appended to the newest segment until it
// reaches segment_bytes, then to a new one; retention marks messages dead
// and removes a segment once nothing in it is live. An index in memory (16
// bytes a message) maps each sequence to its record and receive time.
//
// Nothing about deletions is written but a purge (meta.json's first
// sequence): the limits are a function of what is stored, so open()
// applies them again. Open checks every record's CRC: a torn tail (the
// write a crash interrupted) is cut off; a damaged record further in is
// skipped, the records after it found again by their CRCs; both counted and
// reported in the RecoveryReport.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/message_store.hpp"

namespace rdmabroker::daemon::store {

/// The highest sequence a store takes or finds (a file that names one above
/// it is refused at open: at a million messages a second it takes 146,000
/// years to reach, so one near it is damage, and a wrap-around would reuse).
inline constexpr std::uint64_t kMaxSequence = std::uint64_t{1} << 62;

struct FileStoreOptions {
  std::string directory;  // created if missing
  std::uint64_t segment_bytes = std::uint64_t{64} << 20;
  StoreLimits limits;
  /// Tests only (`fault sync-fail`): asked before each fdatasync; true makes
  /// it fail as one that reports EIO.
  std::function<bool()> fail_sync;
  /// Sequences reserved at a time in meta.json before any is handed out:
  /// after a crash the store goes on past the reservation, so a sequence a
  /// consumer may have seen (written, not yet synced, then lost) is never
  /// given to another message. A crash leaves at most this many unused.
  std::uint64_t reserve = std::uint64_t{1} << 20;
};

/// What open() found and did.
struct RecoveryReport {
  std::uint64_t segments = 0;
  std::uint64_t records = 0;
  std::uint64_t torn_bytes = 0;  // cut off the last segment's end
  std::uint64_t corrupt_records = 0;
  std::uint64_t corrupt_bytes = 0;
  std::uint64_t removed_by_limits = 0;
  std::vector<std::string> problems;  // one line each, for the log
};

class FileStore final : public MessageStore {
 public:
  /// Opens (or creates) the store in `options.directory` and recovers it.
  static StoreResult<std::unique_ptr<FileStore>> open(const FileStoreOptions& options, std::int64_t now_ns,
                                                      RecoveryReport* report = nullptr);
  ~FileStore() override = default;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  StoreResult<std::uint64_t> append(const MessageParts& m, std::int64_t now_ns) override;
  StoreResult<std::uint64_t> stage(const MessageParts& m, std::int64_t now_ns) override;
  StoreStatus flush() override;
  StoreResult<RecordView> read(std::uint64_t sequence, std::span<std::byte> into) override;
  std::optional<std::size_t> length_of(std::uint64_t sequence) const override;
  std::optional<std::string_view> subject_of(std::uint64_t sequence) const override;
  std::optional<std::int64_t> time_of(std::uint64_t sequence) const override;
  std::optional<std::uint64_t> next_live(std::uint64_t from) const override;
  std::uint64_t live_from(std::uint64_t from) const override;
  void scan_since(std::int64_t time_ns, const std::function<void(const RecordView&)>& fn) override;
  /// Called before a segment file is deleted (its records are gone for good
  /// then): the stream saves what it would otherwise learn from them.
  void on_drop(std::function<void()> fn) { on_drop_ = std::move(fn); }
  std::optional<std::uint64_t> first_at_time(std::int64_t time_ns) const override;
  std::vector<std::uint64_t> last_per_subject(std::string_view subject = {}) const override;
  StoreResult<std::uint64_t> sync() override;
  StoreStatus close() override;
  std::uint64_t expire(std::int64_t now_ns) override;
  StoreResult<std::uint64_t> purge() override;
  void set_limits(const StoreLimits& limits) override;
  const StoreLimits& limits() const override { return options_.limits; }
  StoreStats stats() const override;

 private:
  /// One record in the index; entries of a segment are dense: the i-th is
  /// sequence first + i (a record lost to damage is a dead entry).
  struct Entry {
    std::uint32_t offset = 0;
    std::uint32_t length = 0;
    std::int64_t time_ns = 0;
    std::uint32_t subject = 0;  // index into subjects_
    bool live = false;
  };
  struct SegmentIndex {
    Segment file;
    // In blocks, not one array: a growing vector copies the whole index at
    // each doubling (a 64 MiB segment of small records indexes about
    // 600,000 entries: 14 MiB copied on the engine thread in one go) and
    // faults in fresh pages for every copy; a deque's blocks are touched
    // once and, once a segment is removed, reused for the next one.
    std::deque<Entry> entries;
    std::uint64_t live = 0;
  };
  struct SubjectState {
    std::string name;
    std::uint64_t live = 0;
    std::uint64_t last = 0;          // its newest sequence (may have died since: then searched)
    std::deque<std::uint64_t> kept;  // with max_msgs_per_subject: its live sequences, oldest first
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  explicit FileStore(FileStoreOptions options) : options_(std::move(options)) {}

  // file_store_recovery.cpp
  StoreStatus recover(std::int64_t now_ns, RecoveryReport& report);
  /// Indexes one segment's records, those below `next_first` (the next
  /// segment's first sequence; above kMaxSequence for the newest).
  StoreStatus scan(Segment segment, std::uint64_t next_first, RecoveryReport& report);
  /// Indexes the record of `sequence` (`length` bytes at `offset` of the
  /// newest segment); live unless a purge left it below the floor.
  void index(std::uint64_t sequence, std::int64_t time_ns, std::string_view subject, std::uint64_t offset,
             std::size_t length);
  /// meta.json: the first sequence (a purge's floor) and the reservation,
  /// replaced atomically.
  StoreStatus write_meta(std::uint64_t first_sequence, std::uint64_t reserved_through);
  /// Reserves sequences from `sequence` on (meta.json) before it is handed out.
  StoreStatus reserve(std::uint64_t sequence);

  /// The segment holding `sequence` and its entry, if it is indexed.
  std::pair<const SegmentIndex*, const Entry*> find(std::uint64_t sequence) const;
  std::uint32_t subject_id(std::string_view subject);
  /// Marks `sequence` dead (counted as `by_limits`); removes its segment
  /// once nothing in it is live, unless it is the newest.
  void remove(std::uint64_t sequence, bool by_limits);
  /// Enforces the count, byte and per-subject limits after `added` was stored.
  void enforce(std::uint64_t added);
  void enforce_subject(SubjectState& s);
  void rebuild_subject_lists();
  void drop_dead_segments();
  StoreStatus roll(std::uint64_t first_sequence);
  /// fdatasync of `segment` (or the failure options_.fail_sync asks for).
  StoreStatus sync_segment(Segment& segment);
  /// A replay reads consecutive records: a small one comes from a window of
  /// the segment read with one pread (then copied out), not a system call
  /// each. False if it is not a small record or cannot be read that way.
  bool copy_from_read_ahead(const SegmentIndex& seg, const Entry& entry, std::span<std::byte> into);
  /// Writes the staged records, then enforces the limits for them; on
  /// failure takes them back out of the index (remembered for flush()).
  StoreStatus write_staged();
  /// Removes sequences `from`.. (staged, never written) from the index.
  void unindex(std::uint64_t from);
  /// Discard new with a per-subject limit: the count a new message is
  /// refused at depends on what the per-subject limit removed before it, so
  /// each record is written (and the limits enforced) as it comes.
  bool write_through() const {
    return options_.limits.discard == Discard::kNew && options_.limits.max_msgs_per_subject > 0;
  }

  FileStoreOptions options_;
  std::deque<SegmentIndex> segments_;  // oldest first; the last is the one appended to
  std::vector<SubjectState> subjects_;
  std::vector<std::uint32_t> free_subjects_;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> subject_ids_;
  std::uint64_t messages_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t last_sequence_ = 0;
  std::uint64_t floor_ = 1;     // no live sequence is below it (a purge raises it)
  std::uint64_t reserved_ = 0;  // sequences through it may be handed out (meta.json says so)
  std::uint64_t purged_below_ = 1;
  std::function<void()> on_drop_;  // meta.json's first_sequence: what a purge removed (not the limits)
  std::int64_t last_time_ns_ = 0;
  std::uint64_t durable_ = 0;
  /// A roll's sync of the segment it left failed: the next sync() reports
  /// it, so that nothing written before it is taken for durable.
  std::optional<StoreError> sync_failed_;
  std::uint64_t corrupt_records_ = 0;
  std::uint64_t corrupt_bytes_ = 0;
  std::uint64_t torn_bytes_ = 0;
  std::uint64_t removed_by_limits_ = 0;
  std::uint64_t staged_from_ = 0;   // the first staged sequence (0: none)
  std::optional<StoreError> lost_;  // a failed write of staged records, until flush() reports it
  static constexpr std::size_t kReadAheadRecord = 4096;      // larger: read straight into the caller's buffer
  static constexpr std::size_t kReadAheadBytes = 64 * 1024;  // a window
  struct ReadAhead {
    std::uint64_t segment = 0;  // its first sequence (0: none); a segment's is never reused
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::vector<std::byte> bytes;
  } read_ahead_;
};

}  // namespace rdmabroker::daemon::store
