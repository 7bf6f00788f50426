// SPDX-License-Identifier: Apache-2.0
// Connections: the sends handed to a link, and what they retire when they complete (connections.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "connection/connections.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

// ---------------------------------------------------------------- sending

std::uint32_t Connections::pack_next(Connection& c, std::uint32_t max_sge, std::uint32_t block_lkey,
                                     std::uint32_t body_lkey, Segment* sge,
                                     std::array<BufferRef, kMaxFramesPerSend>& refs, PackedSend& packed) {
  const std::uint32_t block = blocks_.peek();
  if (block == SendBlocks::kNone) return block;  // flushed again when a block comes back
  // Version 5's relay time (SPEC.md §3.4) ends here, a moment before the post.
  const std::int64_t posted_at = c.protocol_version >= proto::kRelayTimeVersion
                                     ? std::chrono::steady_clock::now().time_since_epoch().count()
                                     : 0;
  PackLimits limits{c.peer_buffer_size, max_sge, posted_at};
  if (c.takes_landings()) limits.marks = marks_;
  packed = pack_send(c.outq, limits, blocks_.block(block), block_lkey, body_lkey, c.next_sequence, sge,
                     refs.data());
  if (packed.frames == 0) {
    // Cannot happen: the handshake guarantees every frame fits a peer buffer.
    spdlog::error("connection {}: a {}-byte frame does not fit one send", c.id, c.outq.front().wire_len());
    close(c, CloseReason::kProtocolError);
    return SendBlocks::kNone;
  }
  blocks_.take();
  account_packed(c, packed);
  if (packed.num_marks != 0) note_landings(c, packed);
  return block;
}

void Connections::account_packed(Connection& c, const PackedSend& packed) {
  c.queued_replies -= std::min(c.queued_replies, packed.replies);  // close()'s own frame is not counted
  c.pending_messages -= packed.deliveries;
  c.pending_bytes -= packed.delivery_bytes;
  pin(c, -static_cast<std::int64_t>(packed.pins));
  c.unexamined = std::min<std::uint32_t>(c.unexamined, static_cast<std::uint32_t>(c.outq.size()));
  ctx_.stats.pending_messages.add(-static_cast<std::int64_t>(packed.deliveries));
  ctx_.stats.pending_bytes.add(-static_cast<std::int64_t>(packed.delivery_bytes));
  unqueue(c.slot, packed.delivery_bytes);
  ctx_.core.slots->add_sent(c.slot, packed.frames);
}

void Connections::record_send(Connection& c, std::uint32_t block,
                              std::array<BufferRef, kMaxFramesPerSend>* refs, const PackedSend& packed) {
  InflightSend& rec = c.inflight[c.inflight_tail()];
  rec.block = block;
  rec.frames = packed.frames;
  rec.deliveries = packed.deliveries;
  rec.delivered_payload = packed.delivered_payload;
  rec.oldest_received_at = packed.oldest_received_at;
  if (refs != nullptr) {
    for (std::uint32_t i = 0; i < packed.frames; ++i) rec.refs[i] = std::move((*refs)[i]);
  }
  ++c.inflight_count;
}

void Connections::retire_send(Connection& c, bool success) {
  release_send(c, c.inflight[c.inflight_head], success);
  c.inflight_head = (c.inflight_head + 1) % static_cast<std::uint32_t>(c.inflight.size());
  --c.inflight_count;
}

void Connections::retire_send_in_part(Connection& c, std::uint32_t messages, std::uint64_t payload) {
  InflightSend& rec = c.inflight[c.inflight_head];
  count_delivered(c, messages, payload);
  rec.deliveries -= messages;
  rec.delivered_payload -= payload;
  retire_send(c, false);
}

void Connections::trim_send(Connection& c, std::uint32_t keep_frames, std::uint32_t messages,
                            std::uint64_t payload) {
  InflightSend& rec = c.inflight[c.inflight_head];
  for (std::uint32_t i = keep_frames; i < rec.frames; ++i) rec.refs[i].reset();
  rec.frames = keep_frames;
  rec.deliveries -= messages;
  rec.delivered_payload -= payload;
  ctx_.stats.dropped[static_cast<std::size_t>(drop_reason_for(c.reason))].add(messages);
}

void Connections::count_delivered(Connection& c, std::uint32_t messages, std::uint64_t payload) {
  ctx_.stats.deliveries.add(messages);
  ctx_.stats.bytes_out.add(payload);
  c.messages_out += messages;
  c.bytes_out += payload;
  if (c.identity && c.identity->route) {
    ctx_.stats.route_deliveries.add(messages);
    ctx_.stats.route_bytes_out.add(payload);
  }
}

void Connections::unrecord_send(Connection& c) {
  --c.inflight_count;
  release_send(c, c.inflight[c.inflight_tail()], false);
}

void Connections::release_send(Connection& c, InflightSend& rec, bool success) {
  for (std::uint32_t i = 0; i < rec.frames; ++i) rec.refs[i].reset();
  bool wake = false;
  if (rec.block != SendBlocks::kNone) wake = blocks_.give_back(rec.block);
  auto& stats = ctx_.stats;
  if (success) {
    count_delivered(c, rec.deliveries, rec.delivered_payload);
    if (rec.oldest_received_at != 0) {
      const auto age = std::chrono::steady_clock::now().time_since_epoch().count() - rec.oldest_received_at;
      stats.relay_latency.observe(static_cast<double>(age) * 1e-9);
    }
  } else {
    // Handed to the transport but never completed: the subscriber did not get them.
    stats.dropped[static_cast<std::size_t>(drop_reason_for(c.reason))].add(rec.deliveries);
  }
  rec = InflightSend{};
  if (wake) {
    // Connections that found no free send block wait for this one.
    for (auto& [id, other] : table_) {
      if (!other->outq.empty()) touch(*other);
    }
  }
}

void Connections::on_sent(Connection& c) {
  c.last_progress = ctx_.now;
  touch(c);
}

}  // namespace rdmabroker::daemon
