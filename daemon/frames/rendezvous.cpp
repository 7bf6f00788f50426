// SPDX-License-Identifier: Apache-2.0
// FrameHandler: messages offered by rendezvous (SPEC.md §3.8). The broker
// READs an offered message from the publisher's registered region straight
// into pool buffers, each laid out as one fragment of §3.7 (header, the
// strings on the first, a piece of the message), and routes each as if the
// publisher had sent it: recipients, queue bounds, stalls, ABORT and every
// subscriber's view are those of a message in fragments. One READ fills up
// to the link's read_width() buffers; two are in flight at most, so a
// publisher holds at most that many pool buffers beyond what its
// subscribers' queues hold. Nothing of the broker's is remotely accessible:
// the READ is the broker's own work request on its own memory.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "frames/frame_handler.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

namespace {

/// The longest fragment frame a pool buffer of `buffer_size` holds: a
/// PUBLISH that still fits a subscriber's buffer inside its DELIVER (§3.3).
std::uint32_t fragment_frame(std::uint32_t buffer_size) {
  return static_cast<std::uint32_t>(proto::max_publish_frame(buffer_size) & ~(proto::kFrameAlign - 1));
}

/// Bytes before the message's own in the buffer that holds offset `at`:
/// the header, and on the first also the subject and reply.
std::uint32_t prefix_at(const Connection::RendezvousRead& r, std::uint32_t at) {
  return static_cast<std::uint32_t>(proto::kHeaderSize + (at == 0 ? r.subject.size() + r.reply.size() : 0));
}

/// Bytes of the message the buffer that holds offset `at` takes.
std::uint32_t piece_at(const Connection::RendezvousRead& r, std::uint32_t at, std::uint32_t frame) {
  return std::min(frame - prefix_at(r, at), r.length - at);
}

/// Why `type` is refused on `c` (MALFORMED_FRAME, SPEC.md §3.8, §3.9).
std::string needs_rendezvous(const Connection& c, std::string_view type, int version) {
  return std::string(type) + " needs protocol version " + std::to_string(version) +
         " over RDMA with rendezvous in the accept (this connection: version " +
         std::to_string(c.protocol_version) + ", " + std::string(to_string(c.transport())) + ")";
}

}  // namespace

bool FrameHandler::malformed(Connection& c, std::string why) {
  connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame, std::move(why));
  return false;
}

bool FrameHandler::on_offer(Connection& c, const proto::Frame& f) {
  const auto& h = f.header;
  const auto& opt = ctx_.options;
  if (c.rendezvous_min == 0 || c.link->read_width() == 0)
    return malformed(c, needs_rendezvous(c, "RDV_OFFER", proto::kRendezvousVersion));
  proto::RendezvousRegion region;
  if (!proto::decode(f.payload, region)) return malformed(c, "RDV_OFFER's reserved bytes are not zero");
  if (c.identity->route) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                       "RDV_OFFER on a route: a route only subscribes (SPEC.md §8)");
    return false;
  }
  if (c.open_message.open) {
    return fragment_violation(c, "an RDV_OFFER while a fragmented message is open (" +
                                     std::to_string(c.open_message.next_offset) + " of " +
                                     std::to_string(c.open_message.length) + " bytes sent)");
  }
  const std::uint32_t length = h.arg;
  if (length > opt.max_payload) {
    return refuse_too_large(c, "offered message of " + std::to_string(length) +
                                   " bytes exceeds limits.max_payload (" + std::to_string(opt.max_payload) +
                                   ")");
  }
  if (length < c.rendezvous_min) {
    return fragment_violation(c, "an RDV_OFFER of " + std::to_string(length) +
                                     " bytes: the accept allows offers from " +
                                     std::to_string(c.rendezvous_min));
  }
  // The first fragment carries the strings and the whole header block, and
  // at least one byte of the message after it (§3.7).
  const std::size_t frame = fragment_frame(opt.buffer_size);
  const std::size_t first = proto::kHeaderSize + h.subject_len + h.reply_len;
  if (region.header_len % proto::kFrameAlign != 0 || region.header_len >= length ||
      region.header_len > proto::kMaxHeaderBlock) {
    return malformed(c, "RDV_OFFER's header_len " + std::to_string(region.header_len) +
                            " is not a multiple of 8 below the message's length and 65,528");
  }
  if (first + region.header_len + 1 > frame) {
    return refuse_too_large(c,
                            "subject, reply and header block of an offered message leave no room in a "
                            "frame of " +
                                std::to_string(frame) + " bytes");
  }
  if (!may_publish(c, f.subject)) {
    // Refused, not accepted: nothing is read, the client may let the region go.
    deny(c, "publish", f.subject, 0);
    release_offer(c, h.sequence, ErrorCode::kPermissionDenied);
    return true;
  }
  auto& r = c.rendezvous;
  r = Connection::RendezvousRead{};
  r.open = true;
  r.offer = h.sequence;
  r.address = region.address;
  r.rkey = region.rkey;
  r.length = length;
  r.flags = h.flags;
  r.header_len = region.header_len;
  r.subject.assign(f.subject);
  r.reply.assign(f.reply);
  ctx_.stats.rendezvous_offers.add();
  read_more(c);
  return c.is_up();
}

void FrameHandler::read_more(Connection& c) {
  auto& r = c.rendezvous;
  if (!r.open || !c.is_up()) return;
  const auto& opt = ctx_.options;
  BufferPool& pool = *ctx_.core.pool;
  const std::uint32_t frame = fragment_frame(opt.buffer_size);
  const std::uint32_t width = std::min(c.link->read_width(), kMaxFramesPerSend);
  // A stalled publisher's message waits as its frames would (§6).
  while (r.posted < r.length && r.reads < Connection::RendezvousRead::kMaxReads && !c.stalled) {
    // Buffers this READ fills: as many as its width and the message need.
    std::uint32_t pieces_left = 0;
    for (std::uint32_t at = r.posted; at < r.length && pieces_left < width; ++pieces_left)
      at += piece_at(r, at, frame);
    std::array<std::uint32_t, kMaxFramesPerSend> index{};
    const auto got =
        static_cast<std::uint32_t>(pool.acquire(index.data(), pieces_left, ctx_.core.pool_shares.reserve()));
    if (got == 0) {
      // Short of buffers: the port asks again after its next flush.
      if (r.reads == 0) c.link->read_later();
      return;
    }
    std::array<BufferRef, kMaxFramesPerSend> blocks;
    std::array<Segment, kMaxFramesPerSend> pieces{};
    std::uint32_t at = r.posted;
    for (std::uint32_t i = 0; i < got; ++i) {
      blocks[i] = BufferRef(&pool, index[i]);
      std::byte* p = blocks[i].data();
      const bool starts = at == 0;
      proto::FrameHeader fh = proto::FrameHeader::fragment(r.length, at, c.id, starts ? r.flags : 0);
      const std::uint32_t prefix = prefix_at(r, at);
      const std::uint32_t piece = piece_at(r, at, frame);
      if (starts) {
        fh.subject_len = static_cast<std::uint16_t>(r.subject.size());
        fh.reply_len = static_cast<std::uint16_t>(r.reply.size());
        fh.header_len = r.header_len;
        std::memcpy(p + proto::kHeaderSize, r.subject.data(), r.subject.size());
        std::memcpy(p + proto::kHeaderSize + r.subject.size(), r.reply.data(), r.reply.size());
      }
      fh.payload_len = piece;
      proto::encode_header(p, fh);
      // The READ leaves the padding after the piece as the buffer had it.
      const std::size_t end = prefix + piece;
      std::memset(p + end, 0, proto::align_up(end) - end);
      pieces[i] = Segment{reinterpret_cast<std::uint64_t>(p + prefix), piece, 0};
      at += piece;
    }
    const std::uint64_t address = r.address + r.posted;
    if (!c.link->read_remote(address, r.rkey, std::span<const Segment>(pieces.data(), got), blocks)) {
      // No send slot free: a completion (a READ's or a send's) comes first and
      // reads on. A READ in flight will; with none, the port asks again.
      if (r.reads == 0) c.link->read_later();
      return;  // the buffers not posted go back with `blocks`
    }
    ctx_.stats.rendezvous_reads.add();
    r.posted = at;
    ++r.reads;
  }
  if (c.stalled && r.posted < r.length && r.reads == 0) c.link->read_later();
}

void FrameHandler::on_read(Connection& c, std::array<BufferRef, kMaxFramesPerSend>& blocks,
                           std::uint32_t count) {
  auto& r = c.rendezvous;
  if (!r.open || !c.is_up()) return;  // closed meanwhile: the buffers go back with `blocks`
  --r.reads;
  const std::size_t buffer = ctx_.options.buffer_size;
  for (std::uint32_t i = 0; i < count; ++i) {
    proto::Frame f;
    const auto st = proto::decode_frame(std::span<const std::byte>(blocks[i].data(), buffer), buffer, f);
    if (st != proto::DecodeStatus::kOk) {
      // The broker wrote the header: what can be wrong is the header block the region began with.
      connections_.close(c, CloseReason::kProtocolError, proto::error_for(st),
                         "the offered message's header block: " + std::string(proto::to_string(st)));
      return;
    }
    f.offset = 0;
    ctx_.stats.rendezvous_bytes.add(f.header.payload_len);
    if (!on_fragment(c, f, blocks[i])) return;
    r.routed += f.header.payload_len;
  }
  if (r.routed < r.length) {
    read_more(c);
    return;
  }
  const std::uint64_t offer = r.offer;
  r = Connection::RendezvousRead{};
  release_offer(c, offer, ErrorCode::kNone);
  take_held_input(c);
}

bool FrameHandler::on_ready(Connection& c, const proto::Frame& f) {
  if (!c.takes_landings()) return malformed(c, needs_rendezvous(c, "RDV_READY", proto::kLandingVersion));
  proto::LandingArea area;
  if (!proto::decode(f.payload, area)) return malformed(c, "RDV_READY's reserved bytes are not zero");
  std::string why;
  if (!connections_.land(c, f.header.arg, f.header.sequence, area, why)) {
    connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation, why);
    return false;
  }
  return true;
}

void FrameHandler::release_offer(Connection& c, std::uint64_t offer, ErrorCode code) {
  OutItem item = make_control(FrameType::kRendezvousRelease, static_cast<std::uint32_t>(code));
  item.header.sequence = offer;
  item.fixed_sequence = true;
  connections_.enqueue(c, std::move(item));
}

}  // namespace rdmabroker::daemon
