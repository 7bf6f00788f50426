// SPDX-License-Identifier: Apache-2.0
// Connections: landing areas (SPEC.md §3.9). A subscriber of version 9 over
// RDMA may answer the first fragment of a large message with RDV_READY,
// naming memory it registered for the whole message; the fragments between
// the first and the last then go as RDMA WRITEs of their payload into it,
// several in one work request, and only the last goes as a DELIVER, which
// the client sees after every WRITE before it (an RC queue's order). The
// broker's pool is the WRITE's local source: nothing of the broker's is
// remotely accessible. A landing area lives from the pack of its message's
// first fragment to that of its last or of its ABORT (note_landings), so a
// late RDV_READY can never name a message that ended (connections.hpp). A
// client whose connect request said LANDING answers every first fragment
// (with an area or none), so the rest of its queue waits for the answer:
// then the whole message lands, not just what is left once it comes.
#include <algorithm>

#include "connection/connections.hpp"

namespace rdmabroker::daemon {

void Connections::note_landings(Connection& c, const PackedSend& packed) {
  for (std::uint32_t i = 0; i < packed.num_marks; ++i) {
    const MessageMark& m = marks_[i];
    auto& list = c.landings;
    // A message's start replaces what an earlier one of that publisher left
    // (it ends or aborts first; this keeps one entry per pair regardless).
    std::erase_if(list,
                  [&](const Connection::Landing& l) { return l.sid == m.sid && l.publisher == m.publisher; });
    if (m.begins && m.length >= c.rendezvous_min) {
      list.push_back(Connection::Landing{m.sid, m.publisher, m.sequence, 0, 0, false});
    }
  }
}

bool Connections::land(Connection& c, std::uint32_t sid, std::uint64_t sequence,
                       const proto::LandingArea& area, std::string& why) {
  Connection::Landing* l = c.landing_for(sid, area.publisher);
  // Crossed with its message's last fragment (or ABORT): the client lets the
  // area go when that arrives, and nothing is written into it.
  if (l == nullptr || l->first_sequence != sequence) return true;
  if (l->ready) {
    why = "a second RDV_READY for the message of DELIVER " + std::to_string(sequence);
    return false;
  }
  l->ready = true;
  l->address = area.address;
  l->rkey = area.rkey;
  // Address 0: the client named no area (at its bound, or it could not
  // register one): the message goes on in fragments.
  if (area.address != 0) ctx_.stats.landing_areas.add();
  touch(c);  // fragments may be waiting: they go by WRITE now, or as DELIVERs
  return true;
}

namespace {

/// The landing of a queued delivery that may go by WRITE: a publisher's
/// fragment (not a piece the broker cut of one) after its message's first
/// and before its last, whose message has a landing; else null.
Connection::Landing* landing_of(Connection& c, const OutItem& item) {
  if (!item.is_delivery() || !item.fragment || item.begins || item.ends || item.cut_start != 0 || !item.body)
    return nullptr;
  return c.landing_for(item.header.arg, item.publisher);
}

/// Whether fragments of landing `l` go by WRITE: the client named an area.
bool writes_into(const Connection::Landing* l) { return l != nullptr && l->ready && l->address != 0; }

/// A queued fragment's offset in its message (SPEC.md §3.7: the PUBLISH
/// frame's word 20), and where its payload starts (a later fragment has no
/// strings).
std::uint32_t fragment_offset(const OutItem& item) {
  return proto::load<std::uint32_t>(item.body.data() + item.body_offset + 20);
}

}  // namespace

Connections::LandingRun Connections::take_landing_run(Connection& c, std::uint32_t max_sge,
                                                      std::uint32_t body_lkey, Segment* sge,
                                                      std::array<BufferRef, kMaxFramesPerSend>& refs,
                                                      PackedSend& packed, std::uint64_t& remote_address,
                                                      std::uint32_t& rkey) {
  if (c.outq.empty()) return LandingRun::kNone;
  Connection::Landing* l = landing_of(c, c.outq.front());
  // A client that answers every first fragment is waited for: a round trip
  // against the message's whole transfer, and all of it then lands.
  if (l != nullptr && !l->ready && c.answers_landings) return LandingRun::kAwaitsReady;
  if (!writes_into(l)) return LandingRun::kNone;
  const std::uint32_t first = fragment_offset(c.outq.front());
  remote_address = l->address + first;
  rkey = l->rkey;
  const std::uint32_t limit = std::min(max_sge, kMaxFramesPerSend);
  std::uint32_t next = first;
  packed = PackedSend{};
  while (!c.outq.empty() && packed.frames < limit) {
    OutItem& item = c.outq.front();
    // The same message's next bytes: its fragments come in order, back to back.
    if (landing_of(c, item) != l || fragment_offset(item) != next) break;
    sge[packed.frames] =
        Segment{reinterpret_cast<std::uint64_t>(item.body.data() + item.body_offset + proto::kHeaderSize),
                item.payload_bytes, body_lkey};
    next += item.payload_bytes;
    if (item.received_at != 0 &&
        (packed.oldest_received_at == 0 || item.received_at < packed.oldest_received_at))
      packed.oldest_received_at = item.received_at;
    packed.deliveries += item.messages;  // 0: a message counts with its last fragment
    packed.delivered_payload += item.payload_bytes;
    packed.delivery_bytes += item.body_len;
    packed.bytes += item.payload_bytes;
    if (item.pinned) ++packed.pins;
    refs[packed.frames] = std::move(item.body);
    ++packed.frames;
    c.outq.pop_front();
  }
  packed.num_sge = packed.frames;
  account_packed(c, packed);
  ctx_.stats.landing_writes.add();
  ctx_.stats.landing_bytes.add(packed.bytes);
  return LandingRun::kTaken;
}

}  // namespace rdmabroker::daemon
