// SPDX-License-Identifier: Apache-2.0
#include "multicast_streams.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "rdmabroker/proto/multicast.hpp"

namespace rdmabroker {

using proto::FrameType;

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

void SequencedStreams::joined(std::uint32_t sid, std::uint32_t channel, std::uint64_t sequence) {
  Stream& stream = streams_[sid];
  stream.channel = channel;
  if (!stream.started) {
    // Everything before this number came over the connection already.
    stream.started = true;
    stream.next = sequence;
  }
}

void SequencedStreams::left(std::uint32_t sid, std::uint64_t sequence) {
  if (auto it = streams_.find(sid); it != streams_.end() && sequence > 0)
    it->second.tail = std::max(it->second.tail, sequence - 1);
}

void SequencedStreams::add(std::uint32_t sid, std::uint64_t seq, Message&& m, Deliveries& deliveries,
                           bool from_group) {
  Stream& s = streams_[sid];
  if (!s.started) {
    s.started = true;
    s.next = seq;
  }
  if (seq < s.next || s.early.contains(seq)) {
    duplicates.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (from_group) multicast_messages.fetch_add(1, std::memory_order_relaxed);
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

void SequencedStreams::deliver_in_order(std::uint32_t sid, Stream& s, Deliveries& deliveries) {
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

void SequencedStreams::lost(std::uint32_t sid, std::uint64_t first, std::uint64_t count,
                            Deliveries& deliveries, std::vector<Error>& errors) {
  Stream& s = streams_[sid];
  const std::uint64_t end = first + count;
  if (!s.started || end <= s.next) {
    deliver_in_order(sid, s, deliveries);
    return;  // already past it (a later repair brought them after all)
  }
  const std::uint64_t lost = end - std::max(s.next, first);
  s.next = std::max(s.next, end);
  messages_lost.fetch_add(lost, std::memory_order_relaxed);
  errors.push_back(Error{ErrorKind::kMessagesLost,
                         "subscription " + std::to_string(sid) + ": " + std::to_string(lost) +
                             " multicast messages lost (sequence " + std::to_string(end - lost) + ".." +
                             std::to_string(end - 1) + " is beyond the broker's retransmit window)"});
  deliver_in_order(sid, s, deliveries);
}

void SequencedStreams::on_datagram(std::span<const std::byte> datagram, std::uint32_t max_frame,
                                   Deliveries& deliveries) {
  const auto h = proto::decode_datagram(datagram, max_frame);
  if (!h) return;  // not ours, or malformed: a datagram is never trusted further than this
  std::vector<std::uint32_t> sids;
  for (const auto& [sid, s] : streams_) {
    if (s.channel == h->channel) sids.push_back(sid);
  }
  if (sids.empty()) return;
  if (h->total_len == 0) {  // heartbeat: the channel has sent up to h->sequence
    for (auto sid : sids) {
      Stream& s = streams_[sid];
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
      add(sid, h->sequence + i, std::move(m), deliveries, true);
    }
  }
}

std::vector<std::uint32_t> SequencedStreams::forget_ended(
    const std::function<bool(std::uint32_t sid)>& subscribed) {
  std::vector<std::uint32_t> ended;
  for (const auto& [sid, s] : streams_) {
    if (!subscribed(sid)) ended.push_back(sid);
  }
  for (auto sid : ended) streams_.erase(sid);
  return ended;
}

int SequencedStreams::due_repairs(Clock::time_point now, std::vector<Repair>& out) {
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
      const std::uint64_t count = std::min(gap_end - s.next, proto::kMaxRepairCount);
      repairs_requested.fetch_add(count, std::memory_order_relaxed);
      out.push_back({sid, s.next, count});
      s.asked = true;
      s.asked_at = now;
    }
    const auto next_check = (s.asked ? s.asked_at + kRepairRetry : s.gap_since + kRepairDelay) - now;
    const int ms =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(next_check).count()) + 1;
    due = due < 0 ? ms : std::min(due, ms);
  }
  return due;
}

}  // namespace rdmabroker
