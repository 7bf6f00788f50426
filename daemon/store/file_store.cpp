// SPDX-License-Identifier: Apache-2.0
// FileStore: appending, reading, retention. Opening and recovery are in
// file_store_recovery.cpp.
#include "store/file_store.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace rdmabroker::daemon::store {

std::pair<const FileStore::SegmentIndex*, const FileStore::Entry*> FileStore::find(
    std::uint64_t sequence) const {
  // The last segment whose first sequence is at or below `sequence`.
  auto it = std::upper_bound(
      segments_.begin(), segments_.end(), sequence,
      [](std::uint64_t s, const SegmentIndex& seg) { return s < seg.file.first_sequence(); });
  if (it == segments_.begin()) return {nullptr, nullptr};
  const SegmentIndex& seg = *std::prev(it);
  const std::uint64_t i = sequence - seg.file.first_sequence();
  if (i >= seg.entries.size()) return {&seg, nullptr};
  return {&seg, &seg.entries[i]};
}

std::uint32_t FileStore::subject_id(std::string_view subject) {
  if (auto it = subject_ids_.find(subject); it != subject_ids_.end()) return it->second;
  std::uint32_t id;
  if (!free_subjects_.empty()) {
    id = free_subjects_.back();
    free_subjects_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(subjects_.size());
    subjects_.emplace_back();
  }
  subjects_[id].name = subject;
  subject_ids_.emplace(subjects_[id].name, id);
  return id;
}

void FileStore::index(std::uint64_t sequence, std::int64_t time_ns, std::string_view subject,
                      std::uint64_t offset, std::size_t length) {
  SegmentIndex& seg = segments_.back();
  // A sequence whose record was lost to damage keeps its place, dead.
  while (seg.file.first_sequence() + seg.entries.size() < sequence) {
    seg.entries.push_back({0, 0, last_time_ns_, 0, false});
  }
  last_time_ns_ = std::max(time_ns, last_time_ns_);
  last_sequence_ = sequence;
  Entry e{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(length), last_time_ns_, 0, false};
  if (sequence >= floor_) {  // below it: purged before a crash removed the file
    e.subject = subject_id(subject);
    e.live = true;
    ++seg.live;
    ++messages_;
    bytes_ += length;
    SubjectState& s = subjects_[e.subject];
    ++s.live;
    s.last = sequence;
    if (options_.limits.max_msgs_per_subject > 0) s.kept.push_back(sequence);
  }
  seg.entries.push_back(e);
}

StoreResult<std::uint64_t> FileStore::append(const MessageParts& m, std::int64_t now_ns) {
  auto sequence = stage(m, now_ns);
  if (!sequence) return sequence;
  if (auto s = flush(); !s) return s.error();
  return sequence;
}

StoreResult<std::uint64_t> FileStore::stage(const MessageParts& m, std::int64_t now_ns) {
  if (lost_) return *lost_;
  const StoreLimits& limits = options_.limits;
  const std::size_t length = record_length(m);
  if (m.subject.empty() || m.subject.size() > std::numeric_limits<std::uint16_t>::max()) {
    return StoreError{StoreErrc::kTooLarge, "a stored message's subject is 1 to 65,535 bytes"};
  }
  if ((limits.max_msg_size > 0 && m.headers.size() + m.payload.size() > limits.max_msg_size) ||
      length > kMaxRecordBytes) {
    return StoreError{StoreErrc::kTooLarge, "the message is larger than the stream's max_msg_size"};
  }
  if (limits.discard == Discard::kNew && ((limits.max_msgs > 0 && messages_ + 1 > limits.max_msgs) ||
                                          (limits.max_bytes > 0 && bytes_ + length > limits.max_bytes))) {
    return StoreError{StoreErrc::kFull,
                      "the stream is at its limits and refuses new messages (discard: new)"};
  }
  const std::uint64_t sequence = std::max(last_sequence_ + 1, floor_);
  if (sequence > reserved_) {
    if (auto s = reserve(sequence); !s) return s.error();
  }
  if (segments_.empty() ||
      segments_.back().file.first_sequence() + segments_.back().entries.size() != sequence ||
      (segments_.back().file.end() > 0 && segments_.back().file.end() + length > options_.segment_bytes)) {
    if (auto s = roll(sequence); !s) return s.error();
  }
  const std::int64_t time_ns = std::max(now_ns, last_time_ns_);
  const iovec rest[] = {
      {const_cast<char*>(m.subject.data()), m.subject.size()},
      {const_cast<std::byte*>(m.headers.data()), m.headers.size()},
      {const_cast<std::byte*>(m.payload.data()), m.payload.size()},
  };
  const std::uint64_t at = segments_.back().file.stage(encode_header(sequence, time_ns, m), rest);
  if (staged_from_ == 0) staged_from_ = sequence;
  index(sequence, time_ns, m.subject, at, length);
  if (write_through()) {
    // Only this record was staged (each before it was written through): its
    // refusal is the whole report, and staging goes on at once.
    if (auto s = write_staged(); !s) {
      lost_.reset();
      return s.error();
    }
  }
  return sequence;
}

StoreStatus FileStore::flush() {
  auto written = write_staged();
  if (lost_) {
    StoreError e = std::move(*lost_);
    lost_.reset();
    return e;
  }
  return written;
}

StoreStatus FileStore::write_staged() {
  if (staged_from_ == 0) return std::monostate{};
  const std::uint64_t from = staged_from_, to = last_sequence_;
  staged_from_ = 0;
  std::size_t written = 0;
  auto s = segments_.back().file.flush(written);
  if (!s) {
    unindex(from + written);
    lost_ = s.error();
    lost_->lost_from = from + written;
  }
  // Written: only now may the limits remove older messages for them.
  for (std::uint64_t q = from; q < from + written && q <= to; ++q) enforce(q);
  return s;
}

void FileStore::unindex(std::uint64_t from) {
  read_ahead_ = {};
  const std::uint64_t floor = floor_;
  SegmentIndex& seg = segments_.back();
  for (std::uint64_t q = last_sequence_; q >= from; --q) {
    remove(q, false);
    seg.entries.pop_back();
  }
  floor_ = floor;
  last_sequence_ = from - 1;
  if (!seg.entries.empty()) last_time_ns_ = seg.entries.back().time_ns;
}

StoreStatus FileStore::roll(std::uint64_t first_sequence) {
  if (auto s = write_staged(); !s) return s;
  // The segment left behind is synced now, so only the newest ever needs it.
  if (!segments_.empty()) {
    if (auto s = sync_segment(segments_.back().file); !s) {
      // Its error is reported once (a later fdatasync of the file would
      // succeed without its pages): sync() reports it too.
      sync_failed_ = s.error();
      return s;
    }
    if (!sync_failed_) durable_ = last_sequence_;  // else in doubt until sync() has said so
  }
  auto segment = Segment::create(options_.directory, first_sequence);
  if (!segment) return segment.error();
  segments_.push_back({std::move(*segment), {}, 0});
  drop_dead_segments();
  return std::monostate{};
}

StoreResult<RecordView> FileStore::read(std::uint64_t sequence, std::span<std::byte> into) {
  auto [seg, entry] = find(sequence);
  if (entry == nullptr || !entry->live) {
    return StoreError{StoreErrc::kNotFound, "no message " + std::to_string(sequence)};
  }
  if (into.size() < entry->length) {
    return StoreError{StoreErrc::kTooSmall, "message " + std::to_string(sequence) + " needs a larger buffer",
                      entry->length};
  }
  const auto bytes = into.first(entry->length);
  RecordView r;
  std::size_t length = 0;
  if (copy_from_read_ahead(*seg, *entry, bytes)) {
    if (parse_record(bytes, r, length) == ParseOutcome::kOk && r.sequence == sequence) return r;
  }
  // Straight from the file (a large record, or the window's copy did not check out).
  if (auto s = seg->file.read(entry->offset, bytes); !s) return s.error();
  if (parse_record(bytes, r, length) == ParseOutcome::kOk && r.sequence == sequence) return r;
  ++corrupt_records_;
  corrupt_bytes_ += entry->length;
  const std::string where = seg->file.path() + " at offset " + std::to_string(entry->offset);
  remove(sequence, false);
  return StoreError{StoreErrc::kCorrupt, "message " + std::to_string(sequence) + " in " + where +
                                             " does not match its CRC: skipped from now on"};
}

bool FileStore::copy_from_read_ahead(const SegmentIndex& seg, const Entry& entry, std::span<std::byte> into) {
  if (entry.length > kReadAheadRecord) return false;
  ReadAhead& w = read_ahead_;
  const std::uint64_t first = seg.file.first_sequence();
  const auto covers = [&] {
    return w.segment == first && entry.offset >= w.offset && entry.offset + entry.length <= w.offset + w.size;
  };
  if (!covers()) {
    // Records never change once written (a failed write is cut back before
    // anything reads past the end it left), so a window stays true.
    w.bytes.resize(kReadAheadBytes);
    auto n = seg.file.read_some(entry.offset, w.bytes);
    w.segment = n ? first : 0;
    w.offset = entry.offset;
    w.size = n ? *n : 0;
    if (!covers()) return false;
  }
  std::memcpy(into.data(), w.bytes.data() + (entry.offset - w.offset), entry.length);
  return true;
}

std::optional<std::size_t> FileStore::length_of(std::uint64_t sequence) const {
  auto [seg, entry] = find(sequence);
  if (entry == nullptr || !entry->live) return std::nullopt;
  return entry->length;
}

std::optional<std::string_view> FileStore::subject_of(std::uint64_t sequence) const {
  auto [seg, entry] = find(sequence);
  if (entry == nullptr || !entry->live) return std::nullopt;
  return std::string_view(subjects_[entry->subject].name);
}

std::optional<std::int64_t> FileStore::time_of(std::uint64_t sequence) const {
  auto [seg, entry] = find(sequence);
  if (entry == nullptr || !entry->live) return std::nullopt;
  return entry->time_ns;
}

std::optional<std::uint64_t> FileStore::next_live(std::uint64_t from) const {
  from = std::max(from, floor_);
  auto it = std::upper_bound(
      segments_.begin(), segments_.end(), from,
      [](std::uint64_t s, const SegmentIndex& seg) { return s < seg.file.first_sequence(); });
  if (it != segments_.begin()) --it;
  for (; it != segments_.end(); ++it) {
    const std::uint64_t first = it->file.first_sequence();
    if (it->live == 0) continue;
    for (std::uint64_t i = from > first ? from - first : 0; i < it->entries.size(); ++i) {
      if (it->entries[i].live) return first + i;
    }
  }
  return std::nullopt;
}

std::uint64_t FileStore::live_from(std::uint64_t from) const {
  std::uint64_t n = 0;
  for (auto it = segments_.rbegin(); it != segments_.rend(); ++it) {
    const std::uint64_t first = it->file.first_sequence();
    if (first >= from) {
      n += it->live;  // whole
      continue;
    }
    for (std::uint64_t i = from - first; i < it->entries.size(); ++i) n += it->entries[i].live ? 1 : 0;
    break;
  }
  return n;
}

void FileStore::scan_since(std::int64_t time_ns, const std::function<void(const RecordView&)>& fn) {
  std::vector<std::byte> buf;
  for (const SegmentIndex& seg : segments_) {
    if (seg.entries.empty() || seg.entries.back().time_ns < time_ns) continue;
    for (const Entry& e : seg.entries) {
      if (e.length == 0 || e.time_ns < time_ns) continue;  // lost to damage, or older
      buf.resize(e.length);
      RecordView r;
      std::size_t length = 0;
      if (seg.file.read(e.offset, buf) && parse_record(buf, r, length) == ParseOutcome::kOk) fn(r);
    }
  }
}

std::optional<std::uint64_t> FileStore::first_at_time(std::int64_t time_ns) const {
  // Receive times never go backwards within a stream: a binary search.
  for (const SegmentIndex& seg : segments_) {
    if (seg.entries.empty() || seg.entries.back().time_ns < time_ns) continue;
    auto e = std::lower_bound(seg.entries.begin(), seg.entries.end(), time_ns,
                              [](const Entry& x, std::int64_t t) { return x.time_ns < t; });
    return next_live(seg.file.first_sequence() + static_cast<std::uint64_t>(e - seg.entries.begin()));
  }
  return std::nullopt;
}

std::vector<std::uint64_t> FileStore::last_per_subject(std::string_view subject) const {
  std::vector<std::uint64_t> out;
  if (!subject.empty()) {
    if (auto it = subject_ids_.find(subject); it != subject_ids_.end())
      out.push_back(subjects_[it->second].last);
    return out;
  }
  for (const SubjectState& s : subjects_) {
    if (s.live > 0) out.push_back(s.last);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void FileStore::remove(std::uint64_t sequence, bool by_limits) {
  auto [cseg, centry] = find(sequence);
  if (centry == nullptr || !centry->live) return;
  auto& seg = const_cast<SegmentIndex&>(*cseg);  // find() is shared with the const readers
  auto& entry = const_cast<Entry&>(*centry);
  entry.live = false;
  --seg.live;
  --messages_;
  bytes_ -= entry.length;
  if (by_limits) ++removed_by_limits_;
  SubjectState& s = subjects_[entry.subject];
  if (auto k = std::find(s.kept.begin(), s.kept.end(), sequence); k != s.kept.end()) s.kept.erase(k);
  if (--s.live == 0) {
    subject_ids_.erase(s.name);
    s = SubjectState{};
    free_subjects_.push_back(entry.subject);
  } else if (s.last == sequence) {
    // Its newest died (damage found on read): the one before it, searched backwards.
    for (std::uint64_t q = sequence - 1; q >= floor_; --q) {
      auto [qs, qe] = find(q);
      if (qe != nullptr && qe->live && qe->subject == entry.subject) {
        s.last = q;
        break;
      }
    }
  }
  if (sequence == floor_) floor_ = next_live(sequence + 1).value_or(last_sequence_ + 1);
}

void FileStore::enforce_subject(SubjectState& s) {
  while (s.live > options_.limits.max_msgs_per_subject && !s.kept.empty()) remove(s.kept.front(), true);
}

void FileStore::enforce(std::uint64_t added) {
  const StoreLimits& limits = options_.limits;
  if (limits.max_msgs_per_subject > 0 && added != 0) {
    auto [seg, entry] = find(added);
    if (entry != nullptr && entry->live) enforce_subject(subjects_[entry->subject]);
  }
  while (messages_ > 0 && ((limits.max_msgs > 0 && messages_ > limits.max_msgs) ||
                           (limits.max_bytes > 0 && bytes_ > limits.max_bytes))) {
    remove(floor_, true);
  }
  drop_dead_segments();
}

void FileStore::drop_dead_segments() {
  bool told = false;
  for (std::size_t i = 0; i + 1 < segments_.size();) {
    if (segments_[i].live > 0) {
      ++i;
      continue;
    }
    if (on_drop_ && !std::exchange(told, true)) on_drop_();
    if (auto s = segments_[i].file.remove(); !s) spdlog::warn("stream store: {}", s.error().message);
    segments_.erase(segments_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void FileStore::rebuild_subject_lists() {
  for (SubjectState& s : subjects_) s.kept.clear();
  if (options_.limits.max_msgs_per_subject == 0) return;
  for (const SegmentIndex& seg : segments_) {
    for (std::size_t i = 0; i < seg.entries.size(); ++i) {
      if (seg.entries[i].live)
        subjects_[seg.entries[i].subject].kept.push_back(seg.file.first_sequence() + i);
    }
  }
}

void FileStore::set_limits(const StoreLimits& limits) {
  const bool lists = limits.max_msgs_per_subject != options_.limits.max_msgs_per_subject;
  options_.limits = limits;
  if (lists) rebuild_subject_lists();
  if (limits.max_msgs_per_subject > 0) {
    for (SubjectState& s : subjects_) enforce_subject(s);
  }
  // A lower limit removes the oldest whatever the discard policy: that only
  // decides what happens to a new message.
  enforce(0);
}

std::uint64_t FileStore::expire(std::int64_t now_ns) {
  if (options_.limits.max_age_ns <= 0) return 0;
  const std::int64_t cutoff = now_ns - options_.limits.max_age_ns;
  std::uint64_t removed = 0;
  while (messages_ > 0) {
    auto [seg, entry] = find(floor_);
    if (entry == nullptr || entry->time_ns >= cutoff) break;
    remove(floor_, true);
    ++removed;
  }
  if (removed > 0) drop_dead_segments();
  return removed;
}

StoreResult<std::uint64_t> FileStore::purge() {
  const std::uint64_t removed = messages_;
  // The new floor first: a crash before the files are gone leaves records
  // below it, which open() takes as purged.
  if (auto s = write_meta(last_sequence_ + 1, reserved_); !s) return s.error();
  purged_below_ = last_sequence_ + 1;
  for (SegmentIndex& seg : segments_) {
    if (auto s = seg.file.remove(); !s) spdlog::warn("stream store: {}", s.error().message);
  }
  segments_.clear();
  read_ahead_ = {};
  subjects_.clear();
  free_subjects_.clear();
  subject_ids_.clear();
  messages_ = 0;
  bytes_ = 0;
  floor_ = last_sequence_ + 1;
  durable_ = last_sequence_;
  return removed;
}

StoreResult<std::uint64_t> FileStore::sync() {
  if (auto s = write_staged(); !s) return s.error();
  if (sync_failed_) {
    StoreError e = std::move(*sync_failed_);
    sync_failed_.reset();
    return e;
  }
  if (!segments_.empty()) {
    if (auto s = sync_segment(segments_.back().file); !s) return s.error();
  }
  durable_ = last_sequence_;
  return durable_;
}

StoreStatus FileStore::reserve(std::uint64_t sequence) {
  const std::uint64_t through = sequence + std::max<std::uint64_t>(options_.reserve, 1) - 1;
  if (auto s = write_meta(purged_below_, through); !s) return s;
  reserved_ = through;
  return std::monostate{};
}

StoreStatus FileStore::close() {
  if (auto s = sync(); !s) return s.error();
  if (reserved_ <= last_sequence_) return std::monostate{};
  if (auto s = write_meta(purged_below_, last_sequence_); !s) return s;
  reserved_ = last_sequence_;
  return std::monostate{};
}

StoreStatus FileStore::sync_segment(Segment& segment) {
  if (options_.fail_sync && options_.fail_sync()) {
    return StoreError{StoreErrc::kIo, "syncing " + segment.path() + ": Input/output error (fault sync-fail)"};
  }
  return segment.sync();
}

StoreStats FileStore::stats() const {
  StoreStats st;
  st.messages = messages_;
  st.bytes = bytes_;
  st.first_sequence = messages_ > 0 ? floor_ : last_sequence_ + 1;
  st.last_sequence = last_sequence_;
  if (messages_ > 0) {
    st.first_time_ns = find(floor_).second->time_ns;
    st.last_time_ns = last_time_ns_;
  }
  st.subjects = subject_ids_.size();
  st.segments = segments_.size();
  for (const SegmentIndex& seg : segments_) st.disk_bytes += seg.file.size();
  st.durable_sequence = durable_;
  st.corrupt_records = corrupt_records_;
  st.corrupt_bytes = corrupt_bytes_;
  st.torn_bytes = torn_bytes_;
  st.removed_by_limits = removed_by_limits_;
  return st;
}

}  // namespace rdmabroker::daemon::store
