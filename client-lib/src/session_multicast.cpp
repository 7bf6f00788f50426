// SPDX-License-Identifier: Apache-2.0
// The multicast side of a Session (SPEC.md §7): the transport's join
// answers, datagrams from the groups (unpacked, reassembled from fragments),
// each subscription's sequenced stream (every message once, in order,
// whichever path brought it first), repairs of gaps and reported losses.
#include <algorithm>

#include "session.hpp"

namespace rdmabroker {

using proto::FrameType;

// ---------------------------------------------------------------- multicast

namespace {

/// How long a gap may last before it is asked for: the group and the
/// connection race, so a message may simply be on the other path.
constexpr auto kRepairDelay = std::chrono::milliseconds(10);
/// How long an asked-for gap waits before it is asked for again.
constexpr auto kRepairRetry = std::chrono::milliseconds(250);
/// Early messages one stream holds; beyond that newer ones are left to repair.
constexpr std::size_t kMaxEarly = 1u << 16;
/// Messages being reassembled at once (older ones are dropped: repaired later).
constexpr std::size_t kMaxPartials = 256;

}  // namespace

void Session::join_done(std::uint32_t sid, std::uint64_t epoch, const std::string& error) {
  if (!error.empty()) join_failures_.fetch_add(1, std::memory_order_relaxed);
  const auto text = as_payload(std::string_view(error).substr(0, proto::kMaxMcastReasonLen));
  // Its sequence is the MCAST_JOIN's: it names the join it answers.
  send_from_io(sid, FrameType::kMcastJoined, epoch, {text.begin(), text.end()});
}

void Session::send_from_io(std::uint32_t sid, proto::FrameType type, std::uint64_t sequence,
                           std::vector<std::byte> payload) {
  std::unique_lock lock(mu_);
  proto::FrameHeader h;
  h.type = type;
  h.arg = sid;
  if (deferred_.empty() && append_frame_locked(lock, h, {}, {}, payload, sequence, false)) return;
  if (!closed_) deferred_.push_back({sid, type, sequence, std::move(payload)});
}

void Session::on_sequenced(std::uint32_t sid, std::uint64_t seq, Message&& m, Deliveries& deliveries,
                           bool from_group) {
  SequencedStream& s = streams_[sid];
  if (!s.started) {
    s.started = true;
    s.next = seq;
  }
  if (seq < s.next || s.early.contains(seq)) {
    duplicates_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (from_group) multicast_messages_.fetch_add(1, std::memory_order_relaxed);
  s.tail = std::max(s.tail, seq);
  if (seq == s.next) {
    deliveries.add_owned(sid) = std::move(m);
    ++s.next;
    deliver_in_order(sid, s, deliveries);
    return;
  }
  if (s.early.size() < kMaxEarly) s.early.emplace(seq, std::move(m));
  if (s.gap_since == Clock::time_point{}) s.gap_since = Clock::now();
}

void Session::deliver_in_order(std::uint32_t sid, SequencedStream& s, Deliveries& deliveries) {
  while (!s.early.empty() && s.early.begin()->first <= s.next) {
    auto node = s.early.extract(s.early.begin());
    if (node.key() == s.next) {
      deliveries.add_owned(sid) = std::move(node.mapped());
      ++s.next;
    }
  }
  // Progress: a gap that remains is a new one, timed from now.
  const bool gap = !s.early.empty() || s.tail >= s.next;
  s.gap_since = gap ? Clock::now() : Clock::time_point{};
  s.asked = false;
}

void Session::on_loss(std::uint32_t sid, std::uint64_t first, std::uint64_t count,
                      std::vector<Error>& errors) {
  SequencedStream& s = streams_[sid];
  const std::uint64_t end = first + count;
  if (!s.started || end <= s.next) return;  // already past it (a later repair brought them after all)
  const std::uint64_t lost = end - std::max(s.next, first);
  s.next = std::max(s.next, end);
  messages_lost_.fetch_add(lost, std::memory_order_relaxed);
  errors.push_back(Error{ErrorKind::kMessagesLost,
                         "subscription " + std::to_string(sid) + ": " + std::to_string(lost) +
                             " multicast messages lost (sequence " + std::to_string(end - lost) + ".." +
                             std::to_string(end - 1) + " is beyond the broker's retransmit window)"});
}

void Session::on_datagram(std::span<const std::byte> datagram, Deliveries& deliveries) {
  deliveries.received_at = std::chrono::steady_clock::now();
  const auto h = proto::decode_datagram(datagram, recv_buffer_size_);
  if (!h) return;  // not ours, or malformed: a datagram is never trusted further than this
  std::vector<std::uint32_t> sids;
  for (const auto& [sid, s] : streams_) {
    if (s.channel == h->channel) sids.push_back(sid);
  }
  if (sids.empty()) return;
  if (h->total_len == 0) {  // heartbeat: the channel has sent up to h->sequence
    for (auto sid : sids) {
      SequencedStream& s = streams_[sid];
      if (s.started && h->sequence > s.tail) {
        s.tail = h->sequence;
        if (s.tail >= s.next && s.gap_since == Clock::time_point{}) s.gap_since = Clock::now();
      }
    }
    return;
  }
  const auto chunk = datagram.subspan(proto::kDatagramHeaderSize);
  std::span<const std::byte> whole;
  std::vector<std::byte> assembled;
  if (h->offset == 0 && chunk.size() == h->total_len) {
    whole = chunk;  // whole message(s): nothing to reassemble
  } else {
    const auto key = std::make_pair(h->channel, h->sequence);
    Partial& p = partials_[key];
    if (p.bytes.size() != h->total_len) {
      p.bytes.assign(h->total_len, std::byte{});
      p.offsets.clear();
      p.received = 0;
    }
    if (p.offsets.insert(h->offset).second) {
      std::memcpy(p.bytes.data() + h->offset, chunk.data(), chunk.size());
      p.received += static_cast<std::uint32_t>(chunk.size());
    }
    if (p.received < h->total_len) {
      if (partials_.size() > kMaxPartials) partials_.erase(partials_.begin());
      return;
    }
    assembled = std::move(p.bytes);
    partials_.erase(key);
    whole = assembled;
  }
  // `count` PUBLISH frames back to back, with consecutive sequence numbers.
  // Any that does not decode spoils the datagram: what it carried is a gap.
  std::vector<proto::Frame> frames;
  for (std::size_t off = 0; off < whole.size();) {
    proto::Frame inner;
    if (proto::decode_frame(whole.subspan(off), whole.size() - off, inner) != proto::DecodeStatus::kOk ||
        inner.header.type != FrameType::kPublish) {
      return;
    }
    frames.push_back(inner);
    off += inner.header.frame_len();
  }
  if (frames.size() != h->count) return;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    for (auto sid : sids) {
      Message m;
      fill_message(m, sid, frames[i]);
      on_sequenced(sid, h->sequence + i, std::move(m), deliveries, true);
    }
  }
}

void Session::send_repair(std::uint32_t sid, std::uint64_t first, std::uint64_t count) {
  repairs_requested_.fetch_add(count, std::memory_order_relaxed);
  const auto bytes = proto::encode_count(count);
  send_from_io(sid, FrameType::kMcastRepair, first, {bytes.begin(), bytes.end()});
}

int Session::check_gaps() {
  if (!deferred_.empty()) {
    // Frames the I/O thread could not queue earlier, in their order.
    std::unique_lock lock(mu_);
    std::size_t sent = 0;
    for (; sent < deferred_.size(); ++sent) {
      const DeferredFrame& d = deferred_[sent];
      proto::FrameHeader h;
      h.type = d.type;
      h.arg = d.sid;
      if (closed_ || !append_frame_locked(lock, h, {}, {}, d.payload, d.sequence, false)) break;
    }
    deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(sent));
    if (closed_) deferred_.clear();
  }
  if (streams_.empty()) return deferred_.empty() ? -1 : 1;
  {
    // Subscriptions that ended (unsubscribed, refused, or the session
    // closed): their streams and groups go.
    std::vector<std::uint32_t> ended;
    {
      std::lock_guard lock(mu_);
      for (const auto& [sid, s] : streams_) {
        if (!subs_.contains(sid)) ended.push_back(sid);
      }
    }
    for (auto sid : ended) {
      transport_->leave_group(sid);
      streams_.erase(sid);
    }
  }
  const auto now = Clock::now();
  int due = -1;
  for (auto& [sid, s] : streams_) {
    if (!s.started || s.gap_since == Clock::time_point{}) continue;
    const std::uint64_t gap_end = s.early.empty() ? s.tail + 1 : s.early.begin()->first;
    if (gap_end <= s.next) {
      s.gap_since = {};
      continue;
    }
    const auto wait_until = s.asked ? s.asked_at + kRepairRetry : s.gap_since + kRepairDelay;
    if (now >= wait_until) {
      send_repair(sid, s.next, std::min(gap_end - s.next, proto::kMaxRepairCount));
      s.asked = true;
      s.asked_at = now;
    }
    const auto next_check = (s.asked ? s.asked_at + kRepairRetry : s.gap_since + kRepairDelay) - now;
    const int ms =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(next_check).count()) + 1;
    due = due < 0 ? ms : std::min(due, ms);
  }
  if (!deferred_.empty()) due = 1;
  return due;
}

}  // namespace rdmabroker
