// SPDX-License-Identifier: Apache-2.0
// A stream's duplicate window (docs/streams.md, "Acknowledged publishing"):
// the Msg-Id headers of the messages it stored in the last
// duplicate_window_s, each with its sequence, so that a publisher that
// sends a message again after losing its PUB_ACK stores nothing twice and
// is told the first one's sequence. Rebuilt from the stored messages at
// start, so a restart does not open the window. Bounded: ids of at most
// proto::kMaxMsgIdLen bytes (longer ones are refused before they get here),
// at most `max_ids` of them (the oldest go first, counted), so a flood of
// distinct ids costs a stated amount of memory (docs/streams.md).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace rdmabroker::daemon {

/// The header that names a message for duplicate detection.
inline constexpr std::string_view kMsgIdHeader = "Msg-Id";

/// The value of the Msg-Id field of header block `headers` (SPEC.md §3.6), or "".
std::string_view msg_id_of(std::span<const std::byte> headers);

class DuplicateWindow {
 public:
  explicit DuplicateWindow(std::int64_t window_ns = 0, std::size_t max_ids = 100000)
      : window_ns_(window_ns), max_ids_(max_ids) {}
  /// 0: no window (nothing is remembered).
  void set_window(std::int64_t window_ns, std::size_t max_ids) {
    window_ns_ = window_ns;
    max_ids_ = max_ids;
    evict();
  }
  /// Ids forgotten before their window passed, because `max_ids` were remembered (since the last call).
  std::uint64_t take_evicted() { return std::exchange(evicted_, 0); }
  bool enabled() const { return window_ns_ > 0; }
  std::int64_t window_ns() const { return window_ns_; }
  /// The sequence `id` was stored under, if that was within the window before `now_ns`.
  std::optional<std::uint64_t> find(std::string_view id, std::int64_t now_ns);
  /// Remembers `id`, stored as `sequence` at `time_ns`.
  void add(std::string_view id, std::uint64_t sequence, std::int64_t time_ns);
  /// Forgets the ids of sequences `from`.. (their write failed: not stored).
  void forget_from(std::uint64_t from);
  std::size_t size() const { return ids_.size(); }
  bool contains(std::string_view id) const { return ids_.find(id) != ids_.end(); }
  /// What it remembers, as bytes to keep in a file: each id with its
  /// sequence and time, oldest first, under a CRC32C.
  std::string snapshot() const;
  /// Remembers again what `snapshot()` wrote, of it what is still within
  /// the window at `now_ns`; false (and nothing learnt) if `bytes` is not
  /// a whole snapshot.
  bool restore(std::string_view bytes, std::int64_t now_ns);

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void expire(std::int64_t now_ns);
  /// Forgets the oldest while more than max_ids_ are remembered.
  void evict();
  /// Pops the oldest entry of order_; erases its id if that entry is the id's latest.
  bool pop_oldest();

  std::int64_t window_ns_;
  std::size_t max_ids_;
  std::uint64_t evicted_ = 0;
  struct Stored {
    std::uint64_t sequence;
    std::int64_t time_ns;
  };
  std::unordered_map<std::string, Stored, Hash, std::equal_to<>> ids_;
  std::deque<std::pair<std::int64_t, std::string>> order_;  // (time, id), oldest first
};

}  // namespace rdmabroker::daemon
