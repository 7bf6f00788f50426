// SPDX-License-Identifier: Apache-2.0
// What a stream keeps its messages in (docs/streams.md, "Storage"): messages
// appended in order under sequence numbers that are never reused, read back
// by sequence, found by time or subject, removed by the stream's limits or a
// purge, and made durable by sync(). An interface, so that the stream above
// it does not know whether its messages are in files (FileStore) or, once
// the cluster replicates streams, somewhere else as well.
//
// Not thread-safe: a store has one owner, the thread of its stream.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "store/record.hpp"
#include "store/segment.hpp"
#include "store/store_error.hpp"

namespace rdmabroker::daemon::store {

/// What a full stream does with a new message.
enum class Discard { kOld, kNew };

/// Retention: 0 is "no limit" for each.
struct StoreLimits {
  std::uint64_t max_msgs = 0;
  std::uint64_t max_bytes = 0;  // records' bytes, headers included
  std::int64_t max_age_ns = 0;
  std::uint64_t max_msgs_per_subject = 0;  // keep the last N of each subject
  std::uint64_t max_msg_size = 0;          // header block and payload
  Discard discard = Discard::kOld;
};

struct StoreStats {
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;           // the live records'
  std::uint64_t first_sequence = 0;  // of the first live message; last_sequence + 1 when empty
  std::uint64_t last_sequence = 0;   // the last ever stored or, after a crash, reserved (0: none yet)
  std::int64_t first_time_ns = 0;
  std::int64_t last_time_ns = 0;
  std::uint64_t subjects = 0;
  std::uint64_t segments = 0;
  std::uint64_t disk_bytes = 0;        // the segment files' sizes
  std::uint64_t durable_sequence = 0;  // synced through this sequence
  std::uint64_t corrupt_records = 0;   // found at start or on read, skipped
  std::uint64_t corrupt_bytes = 0;
  std::uint64_t torn_bytes = 0;  // cut off the end at start (a write the crash interrupted)
  std::uint64_t removed_by_limits = 0;
};

class MessageStore {
 public:
  virtual ~MessageStore() = default;

  /// Stores `m` received at `now_ns` (a time before the last message's is
  /// taken as the last's); returns its sequence. Refusals: kTooLarge,
  /// kFull (discard new), kDiskFull, kIo: then nothing was stored.
  virtual StoreResult<std::uint64_t> append(const MessageParts& m, std::int64_t now_ns) = 0;
  /// As append(), but the record is written by the next flush(), with all
  /// staged since: one write for a batch. `m`'s bytes must stay valid until
  /// then, and flush() comes before any other call. The sequence is taken
  /// now; once a write failed, staging refuses with its error until flush()
  /// has reported it.
  virtual StoreResult<std::uint64_t> stage(const MessageParts& m, std::int64_t now_ns) = 0;
  /// Writes what stage() queued. On failure the records written whole are
  /// stored and the rest are not: every staged sequence from
  /// `error.lost_from` on is free again (taken by the next message).
  virtual StoreResult<std::monostate> flush() = 0;
  /// Reads message `sequence` into `into` (views into it). kTooSmall says
  /// how much it needs; kNotFound, kCorrupt (then skipped for good).
  virtual StoreResult<RecordView> read(std::uint64_t sequence, std::span<std::byte> into) = 0;
  /// The record length of live message `sequence` (what read() needs), if it is live.
  virtual std::optional<std::size_t> length_of(std::uint64_t sequence) const = 0;
  /// The subject of live message `sequence`, if it is live; the view is
  /// valid until the next call that stores or removes a message.
  virtual std::optional<std::string_view> subject_of(std::uint64_t sequence) const = 0;
  /// The receive time of live message `sequence`, if it is live.
  virtual std::optional<std::int64_t> time_of(std::uint64_t sequence) const = 0;
  /// The first live sequence at or after `from`.
  virtual std::optional<std::uint64_t> next_live(std::uint64_t from) const = 0;
  /// How many live messages have a sequence at or after `from` (sequences
  /// have gaps: what limits removed, damage, a crash's reservation).
  virtual std::uint64_t live_from(std::uint64_t from) const = 0;
  /// Every record still in the store's files received at or after
  /// `time_ns`, in order, live or removed by the limits (what a restart can
  /// still learn from them, such as their Msg-Ids); damaged ones are passed over.
  virtual void scan_since(std::int64_t time_ns, const std::function<void(const RecordView&)>& fn) = 0;
  /// The first live sequence received at or after `time_ns`.
  virtual std::optional<std::uint64_t> first_at_time(std::int64_t time_ns) const = 0;
  /// The last live message of each subject, in sequence order (the
  /// key-value view); only `subject` itself if it is not empty.
  virtual std::vector<std::uint64_t> last_per_subject(std::string_view subject = {}) const = 0;

  /// Makes everything appended durable; returns the sequence it is durable through.
  virtual StoreResult<std::uint64_t> sync() = 0;
  /// An orderly end (the broker stopping, the stream removed): syncs, and
  /// gives back the sequences reserved and not used, so that the next open
  /// goes on from the last one stored. Without it (a crash) the next open
  /// goes on after everything that may have been handed out.
  virtual StoreStatus close() = 0;
  /// Removes what is older than the age limit at `now_ns`; returns how many.
  virtual std::uint64_t expire(std::int64_t now_ns) = 0;
  /// Removes every message; sequences go on from where they were.
  virtual StoreResult<std::uint64_t> purge() = 0;
  /// New limits, applied at once (a lower limit removes what it no longer keeps).
  virtual void set_limits(const StoreLimits& limits) = 0;
  virtual const StoreLimits& limits() const = 0;
  virtual StoreStats stats() const = 0;
};

}  // namespace rdmabroker::daemon::store
