// SPDX-License-Identifier: Apache-2.0
#include "broker/outbound.hpp"

#include <algorithm>
#include <cstring>

namespace rdmabroker::daemon {

OutItem make_control(proto::FrameType type, std::uint32_t arg, std::string text, std::uint32_t sid) {
  OutItem item;
  item.header.sequence = sid;
  item.fixed_sequence = type == proto::FrameType::kError;
  if (text.size() > kMaxControlText) text.resize(kMaxControlText);
  item.header.type = type;
  item.header.arg = arg;
  item.header.payload_len = static_cast<std::uint32_t>(text.size());
  if (!text.empty()) item.text = std::make_unique<std::string>(std::move(text));
  return item;
}

OutItem make_info(std::string text) {
  OutItem item;
  item.header.type = proto::FrameType::kInfo;
  item.header.payload_len = static_cast<std::uint32_t>(text.size());
  item.text = std::make_unique<std::string>(std::move(text));
  return item;
}

OutItem make_info(const Announcement& a, std::uint32_t peer_buffer_size) {
  const auto padded = static_cast<std::uint32_t>(proto::align_up(a.text.size()));
  if (!a.body || proto::kHeaderSize + padded > peer_buffer_size) return make_info(a.short_text);
  OutItem item;
  item.header.type = proto::FrameType::kInfo;
  item.header.payload_len = static_cast<std::uint32_t>(a.text.size());
  item.body = a.body.clone();  // not a delivery: no queue bound counts it (Connections::enqueue)
  item.body_len = padded;
  return item;
}

OutItem make_frame(proto::FrameHeader h, std::string_view subject, std::string_view reply,
                   std::string_view payload) {
  OutItem item;
  h.subject_len = static_cast<std::uint16_t>(subject.size());
  h.reply_len = static_cast<std::uint16_t>(reply.size());
  h.payload_len = static_cast<std::uint32_t>(payload.size());
  item.header = h;
  item.text = std::make_unique<std::string>();
  item.text->reserve(subject.size() + reply.size() + payload.size());
  item.text->append(subject).append(reply).append(payload);
  return item;
}

OutItem make_no_responders(std::string_view reply) {
  OutItem item;
  item.header.type = proto::FrameType::kNoResponders;
  item.header.subject_len = static_cast<std::uint16_t>(reply.size());
  item.text = std::make_unique<std::string>(reply);
  return item;
}

namespace {

/// A PUB_ACK (SPEC.md §3.10) answering the PUBLISH whose id is `id` (and,
/// with RANGE in `flags`, `count` - 1 more): the stream sequence, the count
/// and reserved word of a range, then the stream's name.
OutItem pub_ack(std::uint64_t id, std::uint32_t arg, std::uint16_t flags, std::uint64_t stream_sequence,
                std::uint32_t count, std::string_view stream) {
  proto::FrameHeader h;
  h.type = proto::FrameType::kPubAck;
  h.arg = arg;
  h.flags = flags;
  h.sequence = id;
  const bool range = (flags & proto::kFlagRange) != 0;
  std::string payload(range ? proto::kPubAckRangeMinLen : proto::kPubAckMinLen, '\0');
  std::memcpy(payload.data(), &stream_sequence, sizeof stream_sequence);
  if (range) std::memcpy(payload.data() + sizeof stream_sequence, &count, sizeof count);
  payload.append(stream.substr(0, proto::kMaxStreamNameLen));
  OutItem item = make_frame(h, {}, {}, payload);
  item.fixed_sequence = true;  // the publisher's id, not this connection's frame counter
  return item;
}

}  // namespace

OutItem make_pub_ack(std::uint64_t id, proto::ErrorCode code, std::uint64_t stream_sequence,
                     std::string_view stream, bool duplicate) {
  return pub_ack(id, static_cast<std::uint32_t>(code), duplicate ? proto::kFlagDuplicate : 0, stream_sequence,
                 1, stream);
}

OutItem make_pub_ack_range(std::uint64_t first_id, std::uint32_t count, std::uint64_t first_sequence,
                           std::string_view stream) {
  return pub_ack(first_id, 0, proto::kFlagRange, first_sequence, count, stream);
}

OutItem make_abort(std::uint32_t sid, std::uint64_t publisher_id) {
  OutItem item = make_control(proto::FrameType::kAbort, sid);
  item.header.sequence = publisher_id;
  item.fixed_sequence = true;
  return item;
}

OutItem make_delivery(BufferRef buf, std::uint32_t sid, const RoutedFrame& frame, std::int64_t received_at) {
  OutItem item;
  item.received_at = received_at;
  item.header.type = proto::FrameType::kDeliver;
  item.header.arg = sid;
  item.header.payload_len = frame.len;
  item.body = std::move(buf);
  item.body_offset = frame.offset;
  item.body_len = frame.len;
  item.messages = frame.ends ? 1 : 0;
  item.payload_bytes = frame.payload_len;
  item.fragment = frame.fragment;
  item.begins = frame.begins;
  item.ends = frame.ends;
  item.header_blocks = frame.header_len != 0;
  item.publisher = frame.publisher;
  return item;
}

OutItem make_sequenced_delivery(BufferRef buf, std::uint32_t sid, std::uint64_t sequence,
                                const RoutedFrame& frame, std::int64_t received_at) {
  OutItem item = make_delivery(std::move(buf), sid, frame, received_at);
  item.header.flags = proto::kFlagSequenced;
  item.header.sequence = sequence;
  item.fixed_sequence = true;
  return item;
}

namespace {

/// Whether delivery `tail` may take the frames [offset, offset+len) of
/// buffer `index` for subscription `sid`: they follow its own in the same
/// buffer, the result fits `max_frame`, neither side is a fragment (a
/// fragment travels alone), and a sequenced run takes only the next message
/// of its channel (`sequence`; 0: a plain message).
bool continues_run(const OutItem& tail, std::uint32_t index, std::uint32_t sid, std::uint32_t offset,
                   std::uint32_t len, bool fragment, std::uint32_t max_frame, std::uint64_t sequence) {
  const bool sequenced = (tail.header.flags & proto::kFlagSequenced) != 0;
  if (sequenced ? sequence != tail.header.sequence + tail.messages : sequence != 0) return false;
  return tail.is_delivery() && tail.strip == 0 && tail.cut_start == 0 && tail.header.arg == sid &&
         tail.body && tail.body.index() == index && tail.body_offset + tail.body_len == offset &&
         proto::kHeaderSize + tail.body_len + len <= max_frame && !fragment && !tail.fragment;
}

}  // namespace

bool extend_delivery(OutItem& tail, const BufferRef& buf, std::uint32_t sid, const RoutedFrame& frame,
                     std::uint32_t max_frame, std::uint64_t sequence) {
  if (!continues_run(tail, buf.index(), sid, frame.offset, frame.len, frame.fragment, max_frame, sequence))
    return false;
  tail.body_len += frame.len;
  tail.header.payload_len += frame.len;
  ++tail.messages;
  tail.payload_bytes += frame.payload_len;
  tail.header_blocks = tail.header_blocks || frame.header_len != 0;
  return true;
}

bool extend_delivery(OutItem& tail, const OutItem& run, std::uint32_t max_frame) {
  const bool sequenced = (run.header.flags & proto::kFlagSequenced) != 0;
  if (!run.is_delivery() || !run.body || run.strip != 0 || run.cut_start != 0 ||
      sequenced != ((tail.header.flags & proto::kFlagSequenced) != 0) ||
      !continues_run(tail, run.body.index(), run.header.arg, run.body_offset, run.body_len, run.fragment,
                     max_frame, sequenced ? run.header.sequence : 0)) {
    return false;
  }
  tail.body_len += run.body_len;
  tail.header.payload_len += run.body_len;
  tail.messages += run.messages;
  tail.payload_bytes += run.payload_bytes;
  tail.header_blocks = tail.header_blocks || run.header_blocks;
  if (run.received_at != 0 && (tail.received_at == 0 || run.received_at < tail.received_at))
    tail.received_at = run.received_at;
  return true;
}

namespace {

/// The frame at `at` of a delivery being rewritten for an older or smaller
/// peer: a run carries the facts of its first frame only, so a rewrite
/// reads each frame it rewrites (validated when it was received).
RoutedFrame frame_of(const OutItem& item, std::uint32_t at) {
  return RoutedFrame::of(proto::load_header(item.body.data() + at), at);
}

}  // namespace

std::vector<OutItem> split_without_headers(OutItem item) {
  std::vector<OutItem> pieces;
  const bool sequenced = (item.header.flags & proto::kFlagSequenced) != 0;
  std::uint64_t sequence = item.header.sequence;
  for (std::uint32_t off = 0; off < item.body_len;) {
    const RoutedFrame f = frame_of(item, item.body_offset + off);
    const std::uint64_t seq = sequenced ? sequence++ : 0;
    if (f.header_len == 0 && !pieces.empty() && pieces.back().strip == 0 &&
        extend_delivery(pieces.back(), item.body, item.header.arg, f, UINT32_MAX, seq)) {
      off += f.len;
      continue;
    }
    OutItem piece =
        sequenced ? make_sequenced_delivery(item.body.clone(), item.header.arg, seq, f, item.received_at)
                  : make_delivery(item.body.clone(), item.header.arg, f, item.received_at);
    if (f.header_len != 0) {
      piece.strip = f.header_len;
      piece.header.payload_len -= f.header_len;
      piece.payload_bytes -= f.header_len;
    }
    pieces.push_back(std::move(piece));
    off += f.len;
  }
  return pieces;
}

std::vector<OutItem> cut_to_fit(OutItem item, std::uint32_t max_frame) {
  std::vector<OutItem> pieces;
  const std::uint32_t sid = item.header.arg;
  // A piece's bytes after its two headers: a multiple of 8, so that every
  // piece but a frame's last carries no padding and the next starts aligned.
  const std::uint32_t room = (max_frame - 2 * proto::kHeaderSize) & ~std::uint32_t{7};
  for (std::uint32_t off = 0; off < item.body_len;) {
    const std::uint32_t at = item.body_offset + off;
    const proto::FrameHeader h = proto::load_header(item.body.data() + at);
    const RoutedFrame f = RoutedFrame::of(h, at);
    off += f.len;
    if (proto::kHeaderSize + f.len <= max_frame) {
      if (pieces.empty() || !extend_delivery(pieces.back(), item.body, sid, f, max_frame)) {
        pieces.push_back(make_delivery(item.body.clone(), sid, f, item.received_at));
      }
      continue;
    }
    const std::uint32_t strings = std::uint32_t{h.subject_len} + h.reply_len;
    // Rule 2 of §3.7: the first fragment holds the strings, the whole header block and a payload byte.
    if (strings + f.header_len + 1 > room) {
      pieces.push_back(make_delivery(item.body.clone(), sid, f, item.received_at));
      continue;
    }
    const std::uint32_t body = f.len - proto::kHeaderSize;  // strings, payload, padding
    const std::uint32_t payload_end = strings + f.payload_len;
    for (std::uint32_t start = 0; start < body;) {
      const std::uint32_t len = std::min(room, body - start);
      OutItem piece = make_delivery(item.body.clone(), sid, f, item.received_at);
      piece.cut_start = proto::kHeaderSize + start;
      piece.header.payload_len = proto::kHeaderSize + len;
      piece.body_len = (start == 0 ? proto::kHeaderSize : 0) + len;
      const std::uint32_t from = std::max(start, strings), to = std::min(start + len, payload_end);
      piece.payload_bytes = to > from ? to - from : 0;
      start += len;
      piece.messages = start == body && f.ends ? 1 : 0;
      pieces.push_back(std::move(piece));
    }
  }
  return pieces;
}

proto::FrameHeader cut_header(const std::byte* frame, std::uint32_t start, std::uint32_t len) {
  const proto::FrameHeader in = proto::load_header(frame);
  const std::uint32_t strings_end = proto::kHeaderSize + in.subject_len + in.reply_len;
  const std::uint32_t end =
      std::min(start + len, strings_end + in.payload_len);  // the padding is not payload
  if (start == proto::kHeaderSize) {
    // The first piece: the frame's strings, REQUEST and header block go with it.
    auto h = in.is_fragment() ? proto::FrameHeader::fragment(in.arg, in.offset, in.sequence, in.flags)
                              : proto::FrameHeader::fragment(in.payload_len, 0, 0, in.flags);
    h.subject_len = in.subject_len;
    h.reply_len = in.reply_len;
    h.header_len = in.header_len;
    h.payload_len = end - strings_end;
    return h;
  }
  const std::uint32_t offset = start - strings_end;  // of this piece's payload within the frame's
  auto h = in.is_fragment() ? proto::FrameHeader::fragment(in.arg, in.offset + offset, in.sequence)
                            : proto::FrameHeader::fragment(in.payload_len, offset, 0);
  h.payload_len = end - start;
  return h;
}

namespace {

/// Appends [addr, addr+len) to the SGE list, merging with the previous entry
/// when contiguous in the same registration.
void add_range(Segment* sge, std::uint32_t& n, std::uint64_t addr, std::uint32_t len, std::uint32_t lkey) {
  if (n > 0 && sge[n - 1].lkey == lkey && sge[n - 1].addr + sge[n - 1].length == addr) {
    sge[n - 1].length += len;
    return;
  }
  sge[n++] = Segment{addr, len, lkey};
}

/// Puts `item`'s frame into the send: its header(s) at `dst` in the send
/// block (the whole frame for a control frame without a body: `in_block`
/// bytes), its body as ranges of the pool buffer, whose reference moves to
/// `ref`.
void pack_item(OutItem& item, std::byte* dst, std::size_t in_block, std::uint32_t block_lkey,
               std::uint32_t body_lkey, Segment* sge, std::uint32_t& num_sge, BufferRef& ref) {
  if (item.body && item.cut_start != 0) {
    // [DELIVER header][fragment header][the piece's bytes of the frame, as received]
    const std::byte* frame = item.body.data() + item.body_offset;
    proto::encode_header(dst, item.header);
    proto::encode_header(dst + proto::kHeaderSize, cut_header(frame, item.cut_start, item.cut_len()));
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(dst), 2 * proto::kHeaderSize, block_lkey);
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(frame + item.cut_start), item.cut_len(),
              body_lkey);
    ref = std::move(item.body);
  } else if (item.body && item.strip != 0) {
    // [DELIVER header][PUBLISH header, header_len 0][subject, reply][payload, padding]: the
    // block is a multiple of 8 bytes, so the padding that follows the payload stays right.
    const std::byte* frame = item.body.data() + item.body_offset;
    const std::uint32_t strings =
        proto::load<std::uint16_t>(frame + 6) + proto::load<std::uint16_t>(frame + 8);
    proto::encode_header(dst, item.header);
    std::memcpy(dst + proto::kHeaderSize, frame, proto::kHeaderSize);
    proto::store<std::uint16_t>(dst + proto::kHeaderSize + 10, 0);
    proto::store<std::uint32_t>(dst + proto::kHeaderSize + 12,
                                proto::load<std::uint32_t>(frame + 12) - item.strip);
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(dst), 2 * proto::kHeaderSize, block_lkey);
    const std::byte* after_strings = frame + proto::kHeaderSize + strings;
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(frame + proto::kHeaderSize), strings, body_lkey);
    const std::uint32_t rest = item.body_len - proto::kHeaderSize - strings - item.strip;
    if (rest != 0) {
      add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(after_strings + item.strip), rest, body_lkey);
    }
    ref = std::move(item.body);
  } else if (item.body) {
    proto::encode_header(dst, item.header);
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(dst), proto::kHeaderSize, block_lkey);
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(item.body.data() + item.body_offset),
              item.body_len, body_lkey);
    ref = std::move(item.body);
  } else if (item.header.type != proto::FrameType::kNoResponders &&
             item.header.subject_len + item.header.reply_len != 0) {
    // A frame of its own with strings (make_frame): the text holds them and
    // the payload, as its header says.
    proto::encode_header(dst, item.header);
    const std::string_view text = item.control_text();
    std::memcpy(dst + proto::kHeaderSize, text.data(), text.size());
    std::memset(dst + proto::kHeaderSize + text.size(), 0, in_block - proto::kHeaderSize - text.size());
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(dst), static_cast<std::uint32_t>(in_block),
              block_lkey);
  } else {
    // The body is ERROR/CLOSE text, or NO_RESPONDERS' subject.
    const bool text_is_subject = item.header.type == proto::FrameType::kNoResponders;
    const std::string_view body = item.control_text();
    const auto text = std::as_bytes(std::span<const char>(body.data(), body.size()));
    proto::encode_frame(std::span<std::byte>(dst, in_block), item.header, text_is_subject ? body : "", {},
                        text_is_subject ? std::span<const std::byte>{} : text);
    add_range(sge, num_sge, reinterpret_cast<std::uint64_t>(dst), static_cast<std::uint32_t>(in_block),
              block_lkey);
  }
}

}  // namespace

std::uint32_t relay_ns(std::int64_t received_at, std::int64_t posted_at) {
  return static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(posted_at - received_at, 1, std::int64_t{proto::kMaxRelayNs}));
}

namespace {

/// Notes in `marks` the message in fragments `item` begins or ends, if it
/// does (a publisher's fragment, not a piece the broker cut of one; or ABORT).
void mark_message(const OutItem& item, std::span<MessageMark> marks, PackedSend& out) {
  MessageMark m;
  if (item.header.type == proto::FrameType::kAbort) {
    m.publisher = item.header.sequence;
  } else if (item.is_delivery() && item.fragment && item.cut_start == 0 && (item.begins || item.ends)) {
    m.publisher = item.publisher;
    m.begins = item.begins;
    // The fragment's arg: its message's length (SPEC.md §3.7).
    m.length = proto::load<std::uint32_t>(item.body.data() + item.body_offset + 16);
  } else {
    return;
  }
  m.sid = item.header.arg;
  m.sequence = item.header.sequence;
  marks[out.num_marks++] = m;
}

}  // namespace

PackedSend pack_send(std::deque<OutItem>& queue, const PackLimits& limits, std::span<std::byte> block,
                     std::uint32_t block_lkey, std::uint32_t body_lkey, std::uint64_t& next_sequence,
                     Segment* sge, BufferRef* refs) {
  PackedSend out;
  std::size_t block_used = 0;
  const std::uint32_t max_sge = std::min(limits.max_sge, kMaxSendSge);
  while (!queue.empty() && out.frames < kMaxFramesPerSend) {
    OutItem& item = queue.front();
    const std::size_t wire = item.wire_len();
    // A stripped or cut PUBLISH's rewritten header goes into the block after the DELIVER's.
    const bool rewritten = item.strip != 0 || item.cut_start != 0;
    const std::size_t in_block = item.body ? (rewritten ? 2 : 1) * proto::kHeaderSize : wire;
    const std::uint32_t sge_needed = item.body ? (item.strip != 0 ? 3 : 2) : 1;  // worst case, before merging
    if (out.bytes + wire > limits.max_bytes || block_used + in_block > block.size() ||
        out.num_sge + sge_needed > max_sge) {
      break;
    }
    std::byte* dst = block.data() + block_used;
    if (limits.posted_at != 0 && item.is_delivery() && item.received_at != 0) {
      item.header.set_relay_ns(relay_ns(item.received_at, limits.posted_at));
    }
    // An ERROR's sequence field names the subscription it is about (SPEC.md
    // "Frame header"); every other frame carries the connection's counter.
    if (item.fixed_sequence) {
      ++next_sequence;
    } else {
      item.header.sequence = next_sequence++;
    }
    if (!limits.marks.empty()) mark_message(item, limits.marks, out);
    pack_item(item, dst, in_block, block_lkey, body_lkey, sge, out.num_sge, refs[out.frames]);
    if (item.is_delivery()) {
      if (item.received_at != 0 &&
          (out.oldest_received_at == 0 || item.received_at < out.oldest_received_at)) {
        out.oldest_received_at = item.received_at;
      }
      out.deliveries += item.messages;
      out.delivered_payload += item.payload_bytes;
      out.delivery_bytes += item.body_len;
    } else {
      ++out.replies;
    }
    if (item.pinned) ++out.pins;
    block_used += in_block;
    out.bytes += static_cast<std::uint32_t>(wire);
    out.frame[out.frames] = PackedFrame{out.bytes, item.is_delivery() ? item.messages : 0,
                                        item.is_delivery() ? item.payload_bytes : 0};
    ++out.frames;
    queue.pop_front();
  }
  return out;
}

}  // namespace rdmabroker::daemon
