// SPDX-License-Identifier: Apache-2.0
// What waits to be sent to one client, and how it is packed into SENDs.
//
// A delivery is zero-copy: its header is written into a small registered send
// block, its body (subject, reply, payload, padding) is referenced where it was
// received. One SEND carries as many whole frames as fit the peer's receive
// buffer and the QP's scatter/gather limit, so a busy connection coalesces many
// small messages into one packet train (SPEC.md, "Batching").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "broker/buffer_pool.hpp"
#include "broker/routed_frame.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

/// Most frames one SEND carries: each needs up to two SGEs (header, body).
inline constexpr std::uint32_t kMaxFramesPerSend = 16;
inline constexpr std::uint32_t kMaxSendSge = 2 * kMaxFramesPerSend;
/// A send block holds the headers and control frames of one SEND.
inline constexpr std::uint32_t kSendBlockSize = 1024;
/// Longest ERROR/CLOSE text; keeps a control frame well inside a send block.
inline constexpr std::size_t kMaxControlText = 200;
/// Longest INFO payload for a client whose receive buffers are smaller than
/// the whole INFO (SPEC.md §8, "Gossip"): a frame that fits an empty send
/// block and the smallest receive buffer a client may post.
inline constexpr std::size_t kMaxInfoText = kSendBlockSize - 2 * proto::kHeaderSize;

struct OutItem {
  proto::FrameHeader header;        // sequence is assigned when packed, unless fixed_sequence
  bool fixed_sequence : 1 = false;  // header.sequence means something (ERROR's sid, a channel sequence)
  /// Counted in its connection's pool share: the first queued item that
  /// holds its body buffer (Connections::enqueue, broker/pool_shares.hpp).
  bool pinned : 1 = false;
  /// Deliveries: what their first PUBLISH frame is, from the one decode of
  /// it (broker/routed_frame.hpp), so that no later stage reads its header.
  /// A run holds whole messages only; a cut piece has its frame's facts.
  bool fragment : 1 = false;       // a publisher's fragment (SPEC.md §3.7): it travels alone
  bool begins : 1 = false;         // the frame starts its message
  bool ends : 1 = false;           // the frame completes its message
  bool header_blocks : 1 = false;  // a frame of it carries a header block (SPEC.md §3.6)
  /// A single PUBLISH to a client of protocol version 1: the bytes of its
  /// header block (SPEC.md §3.6), left out when it is packed (two body
  /// ranges around the block, the inner header rewritten). 0: sent as received.
  std::uint16_t strip = 0;
  /// A piece of one PUBLISH frame cut into fragments for a peer whose receive
  /// buffers are smaller than the broker's (SPEC.md §3.7, "Smaller receive
  /// buffers"): the frame's bytes [cut_start, cut_start + cut_len()) after
  /// a fragment header written when it is packed. 0: not cut.
  std::uint32_t cut_start = 0;
  std::uint32_t messages = 0;       // deliveries: PUBLISH frames in the run
  std::uint32_t payload_bytes = 0;  // deliveries: their payload bytes (a run is within one buffer)
  BufferRef body;                   // deliveries: the received buffer holding the PUBLISH frames
  std::uint32_t body_offset = 0;
  std::uint32_t body_len = 0;    // padded bytes after the header, as received (what queues count)
  std::int64_t received_at = 0;  // deliveries: when the run's first frame reached the broker (steady ns)
  std::uint64_t publisher = 0;   // a fragment's: its publisher's connection id
  /// Control frames: their body (ERROR text, NO_RESPONDERS subject), copied
  /// into the send block. Held apart: a delivery, the common item, has none.
  std::unique_ptr<std::string> text;

  std::string_view control_text() const { return text ? std::string_view(*text) : std::string_view(); }
  /// A cut piece's bytes of its frame: what it counts in the queue, less
  /// the frame's header that its first piece counts (and replaces).
  std::uint32_t cut_len() const {
    return body_len - (cut_start == proto::kHeaderSize ? proto::kHeaderSize : 0);
  }
  std::size_t wire_len() const {
    if (cut_start != 0) return 2 * proto::kHeaderSize + cut_len();
    return proto::kHeaderSize + (body ? body_len - strip : proto::align_up(control_text().size()));
  }
  bool is_delivery() const { return header.type == proto::FrameType::kDeliver; }
};

/// A control frame (ERROR, CLOSE, PONG, ...). An ERROR about one subscription
/// carries its id in the sequence field (SPEC.md §3.5): the client ends it.
OutItem make_control(proto::FrameType type, std::uint32_t arg, std::string text = {}, std::uint32_t sid = 0);
/// What this broker's INFO says (SPEC.md §8, "Gossip"), made once per
/// change and shared by every connection: whole, in a pool buffer that each
/// connection's INFO references like a delivery's body (an INFO may be as
/// long as a pool buffer, too long for a send block), and cut to
/// kMaxInfoText for a client with smaller receive buffers.
struct Announcement {
  std::string text;        // whole (at most a pool buffer less a header)
  std::string short_text;  // at most kMaxInfoText bytes; what does not fit is left out
  BufferRef body;  // `text` and its zero padding; empty: the short text is all (or no buffer was free)
};
/// INFO with `text` (at most kMaxInfoText bytes: proto::encode_info's bound).
OutItem make_info(std::string text);
/// The INFO of `a` for a peer whose receive buffers hold `peer_buffer_size`
/// bytes: the whole text if it has a body that fits them, else the short one.
OutItem make_info(const Announcement& a, std::uint32_t peer_buffer_size);
/// A frame this broker sends as a client, on a route it dialed (SUBSCRIBE,
/// UNSUBSCRIBE, PING: SPEC.md §8): `h` with its strings and payload, which
/// fit a send block.
OutItem make_frame(proto::FrameHeader h, std::string_view subject, std::string_view reply,
                   std::string_view payload);
/// NO_RESPONDERS for the request whose reply subject is `reply` (≤ 255 bytes).
OutItem make_no_responders(std::string_view reply);
/// PUB_ACK (SPEC.md §3.10) for the PUBLISH whose ACK id is `id`: `code`
/// kNone when `stream` stored it as `stream_sequence` (`duplicate`: stored
/// before, under that sequence), else why not.
OutItem make_pub_ack(std::uint64_t id, proto::ErrorCode code, std::uint64_t stream_sequence = 0,
                     std::string_view stream = {}, bool duplicate = false);
/// A PUB_ACK with RANGE (version 12): the `count` PUBLISHes with ids from
/// `first_id` on, stored from `first_sequence` on (SPEC.md §3.10).
OutItem make_pub_ack_range(std::uint64_t first_id, std::uint32_t count, std::uint64_t first_sequence,
                           std::string_view stream);
/// ABORT (SPEC.md §3.7): the message publisher `publisher_id` was sending to
/// subscription `sid` in fragments will not be completed.
OutItem make_abort(std::uint32_t sid, std::uint64_t publisher_id);

/// A DELIVER to subscription `sid` of PUBLISH frame `frame` of a received
/// buffer (zero-copy: the item references the buffer).
OutItem make_delivery(BufferRef buf, std::uint32_t sid, const RoutedFrame& frame,
                      std::int64_t received_at = 0);

/// Appends PUBLISH frame `frame` of `buf` to `tail` if it is a DELIVER to
/// the same subscription that ends exactly where this frame starts in the
/// same buffer, and the result stays within `max_frame`; a fragment always
/// travels in a DELIVER of its own (a client of version < 4 is sent none:
/// Connections tells them apart by item). One run of a publisher's batch
/// thus becomes one DELIVER and two SGEs. `sequence`: for a multicast
/// channel's sequenced DELIVER (SPEC.md §7), the frame's channel sequence,
/// which must follow the tail's last one; 0 otherwise.
bool extend_delivery(OutItem& tail, const BufferRef& buf, std::uint32_t sid, const RoutedFrame& frame,
                     std::uint32_t max_frame, std::uint64_t sequence = 0);
/// The same for a whole run: appends delivery `run` (one or more frames as
/// received, not a piece of one) to `tail` under the same rules, its
/// messages counted, the earlier arrival kept. How waiting runs copied
/// into one buffer become one DELIVER (Connections::compact).
bool extend_delivery(OutItem& tail, const OutItem& run, std::uint32_t max_frame);
/// A sequenced DELIVER (SPEC.md §7) of one channel message to subscription `sid`.
OutItem make_sequenced_delivery(BufferRef buf, std::uint32_t sid, std::uint64_t sequence,
                                const RoutedFrame& frame, std::int64_t received_at = 0);

/// What delivery `item` is as a piece of a fragmented message: a fragment
/// (or a piece the broker cut of one), and whether it begins its message.
struct FragmentPiece {
  bool is_fragment = false;
  bool begins = false;
};
inline FragmentPiece fragment_piece(const OutItem& item) {
  if (!item.is_delivery() || !item.body || !item.fragment) return {};
  return {true, item.begins && item.cut_start <= proto::kHeaderSize};
}
/// How many messages delivery `item` begins: what a subscriber that never
/// gets it loses. A whole message (or a run) begins its messages; a
/// publisher's fragment begins its message only if it is the first (a later
/// one's message counts where the first went: its subscriber's queue, and
/// Connection::begun_messages when that closes); a piece the broker cut of
/// such a fragment, only if it is the fragment's first piece.
inline std::uint32_t messages_begun(const OutItem& item) {
  if (!item.is_delivery() || !item.body) return 0;
  const FragmentPiece piece = fragment_piece(item);
  return piece.is_fragment ? (piece.begins ? 1 : 0) : item.messages;
}
/// Whether any PUBLISH frame of delivery `item` carries a header block that
/// would be sent (one left out by `strip` is not).
inline bool carries_headers(const OutItem& item) { return item.header_blocks && item.strip == 0; }
/// Delivery `item` as a client of protocol version 1 can read it: runs of
/// frames without a header block as they are, each frame with one as an item
/// of its own with `strip` set, in order (sequence numbers follow). The
/// queue accounting is unchanged: the pieces' body_len sum to the item's.
std::vector<OutItem> split_without_headers(OutItem item);

/// Delivery `item` as a peer whose receive buffers hold `max_frame` bytes
/// can read it (SPEC.md §3.7, "Smaller receive buffers"), in order: runs of
/// whole frames that fit as they are, each frame that does not fit cut into
/// fragments (each a DELIVER of its own, 8-byte multiples but the last). A
/// frame whose subject, reply and header block leave no payload room in a
/// first fragment stays whole (its wire_len() exceeds `max_frame`): the
/// caller drops it. Queue accounting is unchanged: the pieces' body_len sum
/// to the item's, and a frame's messages count on its last piece. Not for
/// sequenced deliveries (a client that cannot take them joins no channel).
std::vector<OutItem> cut_to_fit(OutItem item, std::uint32_t max_frame);
/// The fragment header of cut piece [start, start + len) of the PUBLISH
/// frame at `frame`: the frame's own fields for its first piece, none of
/// its strings for the others; a whole message cut by the broker has
/// sequence 0, a publisher's fragment keeps its publisher's id.
proto::FrameHeader cut_header(const std::byte* frame, std::uint32_t start, std::uint32_t len);

/// One piece of a packed send: [addr, addr+length) in memory registered with
/// `lkey` (0 where nothing is registered: TCP). The RDMA link posts it as an
/// ibv_sge, the TCP link writes it as an iovec.
struct Segment {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

/// A message in fragments a send begins (its first fragment's DELIVER) or
/// ends (its last, or ABORT), for the peer's landing areas (SPEC.md §3.9).
struct MessageMark {
  std::uint32_t sid = 0;
  std::uint64_t publisher = 0;
  std::uint64_t sequence = 0;  // the DELIVER's
  std::uint32_t length = 0;    // the message's (begins only)
  bool begins = false;
};

struct PackLimits {
  std::uint32_t max_bytes = 0;  // the peer's receive buffer size
  std::uint32_t max_sge = kMaxSendSge;
  /// A peer of protocol version 5: the send's post time (steady ns), from
  /// which each DELIVER's relay time is stamped (SPEC.md §3.4); 0: none.
  std::int64_t posted_at = 0;
  /// A peer that takes landing areas (SPEC.md §3.9): where the send notes
  /// the messages in fragments it begins and ends (at most one per frame;
  /// PackedSend::num_marks says how many). Empty for every other peer.
  std::span<MessageMark> marks;
};

/// The relay time a DELIVER carries (SPEC.md §3.4): from its first message's
/// arrival to `posted_at`, at least 1 (0 means not measured) and saturating.
std::uint32_t relay_ns(std::int64_t received_at, std::int64_t posted_at);

/// Where one packed frame ends in its send, and what it carries: a stream
/// transport cut short mid-send counts what reached the peer by these.
struct PackedFrame {
  std::uint32_t end = 0;       // byte offset of the frame's end within the send
  std::uint32_t messages = 0;  // deliveries in it (0: a control frame)
  std::uint64_t payload = 0;   // their payload bytes
};

struct PackedSend {
  std::array<PackedFrame, kMaxFramesPerSend> frame;  // [0, frames)
  std::int64_t oldest_received_at = 0;               // earliest received_at among its deliveries (0: none)
  std::uint32_t frames = 0;
  std::uint32_t bytes = 0;
  std::uint32_t num_sge = 0;
  std::uint32_t deliveries = 0;         // messages in the packed DELIVERs
  std::uint64_t delivered_payload = 0;  // their payload bytes
  std::uint64_t delivery_bytes = 0;     // the PUBLISH frames' bytes (what queue bounds count)
  std::uint32_t replies = 0;            // control frames (PONG, ERROR, NO_RESPONDERS, CLOSE)
  std::uint32_t pins = 0;               // items counted in the connection's pool share (OutItem::pinned)
  std::uint32_t num_marks = 0;          // [0, num_marks) of PackLimits::marks are this send's
};

/// Moves frames from the front of `queue` into one SEND: headers and control
/// frames are written to `block` (registered with `block_lkey`), bodies are
/// referenced with `body_lkey`, adjacent ranges merge into one SGE. Body
/// references move to `refs` (at least kMaxFramesPerSend slots). Assigns
/// sequence numbers from `next_sequence`. Packs nothing if the first frame
/// does not fit (the caller guarantees it does: a peer of version < 4 has
/// buffers as large as the broker's frames, what does not fit a smaller
/// one's is cut to fit by cut_to_fit()).
PackedSend pack_send(std::deque<OutItem>& queue, const PackLimits& limits, std::span<std::byte> block,
                     std::uint32_t block_lkey, std::uint32_t body_lkey, std::uint64_t& next_sequence,
                     Segment* sge, BufferRef* refs);

}  // namespace rdmabroker::daemon
