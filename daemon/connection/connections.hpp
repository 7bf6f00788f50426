// SPDX-License-Identifier: Apache-2.0
// A worker's connections: the table that owns them, their out-queues and
// their bounds, the flush of touched connections through their links, the
// accounting of sends the links complete, the deadlines (authentication,
// write, publisher stall, drain) and the single close path every connection
// takes however it ends. Transport-neutral: what differs between RDMA and
// TCP is behind Connection::link.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/routed_frame.hpp"
#include "broker/send_blocks.hpp"
#include "connection/connection.hpp"
#include "connection/worker_context.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

class Connections {
 public:
  /// Replies (PONG, ERROR, NO_RESPONDERS) a connection may have queued and
  /// unsent. max_pending_bytes bounds deliveries only; without this a client
  /// that keeps asking (PINGs, denied publishes, requests nobody serves) and
  /// never reads would grow its queue without limit. Beyond it the client is
  /// cut off as a slow consumer.
  static constexpr std::uint32_t kMaxQueuedReplies = 1024;
  /// A connection whose waiting items hold fewer pool buffers than this
  /// keeps them where they are (compact()).
  static constexpr std::int64_t kCompactAbovePins = 4;
  /// A delivery is copied out of its receive buffer once it has waited this
  /// long (compact()).
  static constexpr std::chrono::milliseconds kCompactAfter{2};

  Connections(WorkerContext& ctx, SendBlocks& blocks) : ctx_(ctx), blocks_(blocks) {}
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // ------------------------------------------------------------ the table
  /// Takes ownership of a new connection (counted as current).
  Connection& add(std::unique_ptr<Connection> c);
  Connection* find(std::uint64_t id);
  /// The connection if it is up (transport established, not closing), else null.
  Connection* find_up(std::uint64_t id);
  bool empty() const { return table_.empty(); }
  /// Calls f(Connection&) for each; f must not add or destroy connections (closing is fine).
  template <typename F>
  void for_each(F&& f) {
    for (Connection* c : snapshot()) f(*c);
  }

  // ------------------------------------------------------------ state machine
  /// accepting -> awaiting_connect: the transport is up (RDMA: on the CM event
  /// or the first receive, whichever the worker sees first; TCP: after its
  /// handshake). Starts the authentication deadline.
  void establish(Connection& c);
  /// The single way a connection ends. `code` != kNone tells the client why
  /// (ERROR, or CLOSE for shutdown and slow consumers) before the disconnect.
  void close(Connection& c, CloseReason reason, proto::ErrorCode code = proto::ErrorCode::kNone,
             std::string message = {});
  /// The transport ended under the connection (DISCONNECTED, FIN, an error).
  void peer_gone(Connection& c, CloseReason reason);
  /// A disconnecting connection is done once the peer is gone and nothing is
  /// in flight, or at its deadline: then it is destroyed at the end of the turn.
  void try_finish(Connection& c);
  /// Destroys the connections that finished closing (end of a loop turn).
  void reap();
  /// Closes connection `id` if it has not authenticated yet (the broker-wide
  /// bound on unauthenticated connections made room for a newer one); false
  /// if there is no such connection here.
  bool evict_unauthenticated(std::uint64_t id);
  /// Closes every connection for a shutdown: open ones are told so.
  void close_all_for_shutdown();

  /// Called when a connection with a fragmented message in progress closes
  /// (the router aborts the message for its recipients).
  void on_message_cut(std::function<void(Connection&)> f) { message_cut_ = std::move(f); }
  /// Called when a publisher's stall ends (the frame layer takes its held
  /// input, then resumes its link); without one, the link just resumes.
  void on_stall_end(std::function<void(Connection&)> f) { stall_end_ = std::move(f); }

  // ------------------------------------------------------------ out-queue
  /// Queues a frame for `c` within its bounds; a subscriber over them is cut
  /// off as a slow consumer (the item counted as dropped).
  void enqueue(Connection& c, OutItem item);
  /// Queues routed PUBLISH frame `frame` of `buf` for subscription `sid`,
  /// extending c's last DELIVER run where possible.
  void deliver(Connection& c, const BufferRef& buf, std::uint32_t sid, const RoutedFrame& frame);
  /// Marks `c` for the flush at the end of the loop turn.
  void touch(Connection& c);
  /// Flushes every touched connection through its link.
  void flush_touched();

  // ------------------------------------------------------------ sending (the links)
  /// Packs the front of c's queue into a send block: what both transports'
  /// flush share. Returns the block, or SendBlocks::kNone (no block free, or
  /// nothing fits).
  std::uint32_t pack_next(Connection& c, std::uint32_t max_sge, std::uint32_t block_lkey,
                          std::uint32_t body_lkey, Segment* sge,
                          std::array<BufferRef, kMaxFramesPerSend>& refs, PackedSend& packed);
  /// The front of c's queue as one RDMA WRITE into a landing area (SPEC.md
  /// §3.9; connection/landings.cpp): the fragments after a message's first
  /// and before its last, for which the client named its area, as many in
  /// a row as `max_sge` allows, each one SGE of its payload (`body_lkey`).
  /// Fills `packed` as pack_next does and sets where they go (kTaken);
  /// kNone (nothing taken) if the front is not such a fragment.
  /// kAwaitsReady: the front is such a fragment of a message whose client
  /// answers (LANDING) and has not yet: nothing of c's queue goes before it.
  enum class LandingRun : std::uint8_t { kNone, kTaken, kAwaitsReady };
  LandingRun take_landing_run(Connection& c, std::uint32_t max_sge, std::uint32_t body_lkey, Segment* sge,
                              std::array<BufferRef, kMaxFramesPerSend>& refs, PackedSend& packed,
                              std::uint64_t& remote_address, std::uint32_t& rkey);
  /// RDV_READY (SPEC.md §3.9): the client named the landing area of the
  /// message whose first fragment's DELIVER had `sequence`. False (and why)
  /// if that message had a landing area already; a READY that crossed the
  /// message's end is ignored.
  bool land(Connection& c, std::uint32_t sid, std::uint64_t sequence, const proto::LandingArea& area,
            std::string& why);
  /// Records a send at the tail of c's in-flight ring (what it references).
  void record_send(Connection& c, std::uint32_t block, std::array<BufferRef, kMaxFramesPerSend>* refs,
                   const PackedSend& packed);
  /// Retires the oldest in-flight send; its deliveries count as delivered or dropped.
  void retire_send(Connection& c, bool success);
  /// Retires the oldest in-flight send, which reached the peer only in part
  /// (a stream cut at its deadline): its first `messages` deliveries
  /// (`payload` bytes) count as delivered, the others as dropped.
  void retire_send_in_part(Connection& c, std::uint32_t messages, std::uint64_t payload);
  /// Shortens the oldest in-flight send to its first `keep_frames` frames
  /// (cut_short): the `messages` deliveries of the others (`payload` bytes)
  /// are dropped, counted under c's close reason, and their buffers released.
  void trim_send(Connection& c, std::uint32_t keep_frames, std::uint32_t messages, std::uint64_t payload);
  /// Undoes the newest in-flight send, never handed to the transport.
  void unrecord_send(Connection& c);
  /// A send completed and the connection may send more: records progress,
  /// and wakes connections that waited for a send block.
  void on_sent(Connection& c);

  // ------------------------------------------------------------ flow control
  /// Slows `publisher` (its link paused) because the subscriber in `slot` is backlogged.
  void stall(Connection& publisher, std::uint32_t slot);
  /// Whether a subscriber with `queued` frame bytes routed to it
  /// (ConnectionSlots::queued) holds more than 1/share_divisor of its
  /// fair_pending_share() while the broker's queues together charge more
  /// than total_percent % of limits.max_pending_bytes_total: the broker-wide
  /// bound's part of the stall watermark (Router::over_watermark) and of
  /// the drain that ends a stall.
  bool crowds_total(std::int64_t queued, std::int64_t share_divisor, std::int64_t total_percent) const;

  // ------------------------------------------------------------ deadlines
  /// Stalls, authentication, open messages, drains and write deadlines; once per loop turn.
  void check_deadlines();
  /// `c` opened a message in fragments (its waiting_since set by the caller):
  /// its next fragments are due within limits.fragment_timeout_ms of each
  /// other (SPEC.md §3.7).
  void watch_open_message(Connection& c);
  /// True while a stall or a closing connection needs the loop to look again soon.
  bool needs_prompt_check() const { return !stalled_.empty(); }
  /// RDMA links: whether `c` now waits for a send completion to send more
  /// (RdmaLink::flush says so after each flush).
  void set_awaits_send(Connection& c, bool awaits) {
    if (c.awaits_send == awaits) return;
    c.awaits_send = awaits;
    awaiting_send_ += awaits ? 1 : -1;
  }
  /// Whether a send completion is awaited: a connection waits for a send
  /// slot or block, or a closing one for its last sends to leave. The loop
  /// then arms its send CQs before sleeping; otherwise their completions
  /// wake nobody and are reaped on the next turn.
  bool sends_awaited() const { return awaiting_send_ > 0 || !closing_.empty(); }

 private:
  void flush(Connection& c);
  /// Counts `n` more (or fewer) pool buffers held by c's out-queue, in c,
  /// its slot, its tenant and the broker-wide totals.
  void pin(Connection& c, std::int64_t n);
  /// What a packed send (or a WRITE's run) took from c's queue, taken off
  /// its counts (queue, pool share, the broker's gauges).
  void account_packed(Connection& c, const PackedSend& packed);
  /// The landing areas a packed send began or ended messages for (marks_; landings.cpp).
  void note_landings(Connection& c, const PackedSend& packed);
  /// The items a flush left waiting in c's out-queue (those it had not
  /// looked at yet, once they have waited kCompactAfter): small messages
  /// whose receive buffers no one else holds are copied compactly into a
  /// buffer of c's own, so that those buffers go back to the pool, and runs
  /// of them to one subscription merge into one DELIVER.
  void compact(Connection& c);
  /// Cuts c as a slow consumer if its out-queue holds more pool buffers than
  /// its share, or, while the pool runs short, if its tenant's hold more
  /// than the tenant's share or c more than its equal part of the
  /// out-queues' budget; true if it did.
  bool over_pool_share(Connection& c);
  void disconnect(Connection& c);
  /// A route this broker dialed ended (or never came up): the routes hear
  /// it once, with the reason its broker gave if it gave one.
  void report_route_down(Connection& c, CloseReason reason, const std::string& message);
  void drop_queue(Connection& c, DropReason why);
  /// A closing connection's fragmented message in progress: aborted for its recipients.
  void end_open_message(Connection& c);
  /// For a client of version < 4: true (and counted) if `item` is a fragment
  /// or an ABORT, which it cannot read and is not sent.
  bool refuse_fragments(Connection& c, const OutItem& item);
  /// For a client whose receive buffers are smaller than the broker's: true
  /// if `item` was cut to fit them and queued piece by piece, or dropped
  /// (counted) because it cannot be (SPEC.md §3.7, "Smaller receive buffers").
  bool cut_for_peer(Connection& c, OutItem& item);
  /// One piece of an item split for `c`: queued, or dropped (counted) when
  /// an earlier piece closed `c` as a slow consumer.
  void enqueue_piece(Connection& c, OutItem piece);
  void destroy(Connection& c);
  void release_send(Connection& c, InflightSend& rec, bool success);
  void count_delivered(Connection& c, std::uint32_t messages, std::uint64_t payload);
  /// Whether `len` more bytes may queue for `c`: within limits.max_pending_bytes, and above
  /// fair_pending_share() only while the broker-wide total stays within limits.max_pending_bytes_total.
  bool may_queue(const Connection& c, std::uint64_t len, std::uint32_t messages = 1) const;
  /// A connection's share of limits.max_pending_bytes_total: total / max_connections.
  std::uint64_t fair_pending_share() const;
  /// Messages for `slot` left the broker's queues (sent or dropped).
  void unqueue(std::uint32_t slot, std::uint64_t bytes) {
    ctx_.core.slots->add_queued(slot, -static_cast<std::int64_t>(bytes));
  }
  void check_stalls();
  void check_auth_deadlines();
  /// Closes a publisher whose open message waited longer than
  /// limits.fragment_timeout_ms for its next fragment while it could send.
  void check_open_messages();
  void check_closing();
  void check_write_deadlines();
  /// The connections now, for a walk that may close some of them.
  std::vector<Connection*> snapshot() const;

  WorkerContext& ctx_;
  SendBlocks& blocks_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Connection>> table_;
  std::vector<Connection*> touched_;
  std::vector<std::uint64_t> unauthenticated_;  // connections with an authentication deadline
  std::vector<std::uint64_t> closing_;          // draining or disconnecting: deadlines to check
  std::vector<std::uint64_t> reap_;             // to destroy at the end of the loop turn
  std::vector<std::uint64_t> stalled_;          // publishers whose links are paused for a while
  std::vector<std::uint64_t> open_messages_;    // publishers with a message in fragments open
  std::int64_t awaiting_send_ = 0;              // connections with awaits_send
  std::chrono::steady_clock::time_point next_write_check_{};
  std::function<void(Connection&)> message_cut_;  // on_message_cut
  std::function<void(Connection&)> stall_end_;    // on_stall_end
  /// What the last pack for a landing subscriber noted (PackLimits::marks):
  /// scratch reused by every pack, so other peers' sends carry none of it.
  std::array<MessageMark, kMaxFramesPerSend> marks_;
};

}  // namespace rdmabroker::daemon
