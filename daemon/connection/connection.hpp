// SPDX-License-Identifier: Apache-2.0
// One client connection as every layer above the transport sees it: its state
// machine, what waits to be sent (the out-queue), what was handed to the
// transport and not yet completed (the in-flight ring), the publisher stall,
// authentication and subscriptions. The transport itself is the connection's
// Link (rdma/rdma_link.hpp, tcp/tcp_link.hpp, or a test's fake): the only
// code that knows whether bytes travel as SENDs on a QP or over a socket.
//
// Owned by one worker (Connections), touched only on its thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "broker/auth.hpp"
#include "broker/rate_limit.hpp"
#include "broker/buffer_pool.hpp"
#include "broker/close_reason.hpp"
#include "broker/outbound.hpp"
#include "broker/pool_shares.hpp"
#include "broker/subscription_index.hpp"
#include "connection/dialed_route.hpp"
#include "fault/fault.hpp"
#include "rdmabroker/result.hpp"

struct sockaddr;

namespace rdmabroker::daemon {

struct Connection;

enum class Transport : std::uint8_t { kRdma, kTcp };

constexpr std::string_view to_string(Transport t) { return t == Transport::kRdma ? "rdma" : "tcp"; }

/// A connection's life, one state at a time (SPEC.md §2):
///
///   accepting -> awaiting_connect -> verifying -> open
///        \______________\_______________\__________\__> draining -> disconnecting -> (destroyed)
///
/// `accepting` is RDMA's wait for ESTABLISHED (TCP's 16-byte handshake is done
/// by its acceptor before a Connection exists). Until `open` the first frame
/// must be CONNECT, and only PING, CREDIT and CLOSE may follow it while the
/// authenticator decides (`verifying`). Any state may close: `draining` sends
/// the last frames (an ERROR or CLOSE saying why), `disconnecting` waits for
/// the transport's end (DISCONNECTED, or the peer's FIN) and for in-flight
/// sends, both bounded by flow.drain_timeout_ms.
enum class ConnState : std::uint8_t {
  kAccepting,
  kAwaitingConnect,
  kVerifying,
  kOpen,
  kDraining,
  kDisconnecting,
};

constexpr std::string_view to_string(ConnState s) {
  switch (s) {
    case ConnState::kAccepting:
      return "accepting";
    case ConnState::kAwaitingConnect:
      return "awaiting_connect";
    case ConnState::kVerifying:
      return "verifying";
    case ConnState::kOpen:
      return "established";
    case ConnState::kDraining:
      return "draining";
    case ConnState::kDisconnecting:
      return "disconnecting";
  }
  return "unknown";
}

/// The transport under one connection, bound to it when the connection is
/// made (Connection's constructor). Every call comes from the owning
/// worker's thread.
class Link {
 public:
  virtual ~Link() = default;
  /// Called once, by the Connection that takes this link.
  void bind(Connection& c) { connection_ = &c; }
  virtual Transport transport() const = 0;
  /// What `stat` and the log call it: "rdma", "tcp", or "tls" (TCP inside TLS).
  virtual std::string_view protocol() const { return to_string(transport()); }
  /// Hands the front of c's out-queue to the transport, as much as it takes
  /// now (credits, send window, socket buffer); the rest waits for the next flush.
  virtual void flush() = 0;
  /// Publisher flow control while a subscriber it feeds is backlogged: RDMA
  /// withholds the publisher's credits, TCP stops reading its socket.
  virtual void pause() = 0;
  virtual void resume() = 0;
  /// The peer's CREDIT frame (RDMA; TCP's window does this job and ignores it).
  virtual void add_send_credits(std::uint32_t n) = 0;
  /// The connection is closing and its queue was dropped: a stream transport
  /// ends its send in progress after the frame being written, so that the
  /// ERROR and CLOSE that follow reach the peer as whole frames soon (RDMA
  /// posts whole SENDs: nothing to do).
  virtual void cut_short() {}
  /// Ends the transport after the last frame went out (RDMA: the QP to the
  /// error state; TCP: FIN). The connection then waits for the peer's end.
  virtual void disconnect() = 0;
  /// Called once, just before the connection is destroyed: gives back what
  /// the link took from shared resources (CQ entries, SRQ credits, counts).
  virtual void release() = 0;
  /// The connection authenticated: what it was kept from until then (RDMA:
  /// its full credit grant) may be given now.
  virtual void on_authenticated() {}
  /// How many pool buffers one READ of the peer's memory may fill (a
  /// rendezvous, SPEC.md §3.8); 0: this transport cannot READ (TCP).
  virtual std::uint32_t read_width() const { return 0; }
  /// READs `pieces` (pool buffer bytes, in order) from the peer's memory at
  /// `address` with `rkey`, one work request; `blocks` (the pool buffers,
  /// one per piece) stay in the in-flight ring until it completes. False if
  /// it was not posted (no send slot, or the post failed).
  virtual bool read_remote(std::uint64_t address, std::uint32_t rkey, std::span<const Segment> pieces,
                           std::array<BufferRef, kMaxFramesPerSend>& blocks) {
    (void)address, (void)rkey, (void)pieces, (void)blocks;
    return false;
  }
  /// A rendezvous waits for pool buffers or the end of a stall: the port
  /// asks the frame handler to go on reading after its next flush.
  virtual void read_later() {}
  /// RDMA: the credits granted to the client now (SPEC.md §5); 0 for TCP.
  virtual std::uint32_t receive_window() const { return 0; }
  /// The broker is not taking the peer's frames now, whatever the reason
  /// (TCP: its socket is not read; RDMA: it holds no credit to send data):
  /// deadlines on what the peer sends do not run meanwhile.
  virtual bool input_paused() const = 0;
  /// Where the connection lives, for its log lines ("on rxe0, qp 17").
  virtual std::string where() const = 0;
  /// The address a multicast member receives on and its device index, for
  /// a client that may join groups (RDMA only), or null.
  virtual const sockaddr* multicast_address(std::uint32_t& device) const {
    (void)device;
    return nullptr;
  }
  /// Test builds: arms fault `kind` on this link (the admin socket's
  /// `fault` command, docs/testing.md); why it could not, if it could not.
  virtual Status inject_fault(fault::Kind kind) {
    (void)kind;
    return Error{ErrorKind::kInvalidArgument, "not a fault of this transport"};
  }

 protected:
  /// The connection this link carries.
  Connection& connection() const { return *connection_; }

 private:
  Connection* connection_ = nullptr;
};

/// One send handed to the transport and not yet completed, with what it references.
struct InflightSend {
  std::uint32_t block = 0;  // send block index, or SendBlocks::kNone (a credit update)
  std::uint32_t frames = 0;
  std::int64_t oldest_received_at = 0;  // for the relay latency histogram
  std::uint32_t deliveries = 0;         // DELIVER frames among them
  std::uint64_t delivered_payload = 0;  // their payload bytes
  /// An RDMA READ of a rendezvous offer (SPEC.md §3.8), not a send: `refs`
  /// are the `frames` pool buffers it fills, handed to the frame handler
  /// when it completes.
  bool read = false;
  /// An RDMA WRITE of fragments into a subscriber's landing area (SPEC.md
  /// §3.9), not a send: `refs` are their pool buffers, as a send's.
  bool write = false;
  std::array<BufferRef, kMaxFramesPerSend> refs;
};

struct Connection {
  Connection(std::uint64_t id, std::uint32_t slot, std::string peer, std::unique_ptr<Link> link,
             std::uint32_t peer_buffer_size, std::uint32_t send_window, ConnState initial);
  Connection(const Connection&) = delete;  // its link points at it
  Connection& operator=(const Connection&) = delete;

  /// The transport is up and the connection is not closing (frames are taken from it).
  bool is_up() const {
    return state == ConnState::kAwaitingConnect || state == ConnState::kVerifying ||
           state == ConnState::kOpen;
  }
  bool is_closing() const { return state == ConnState::kDraining || state == ConnState::kDisconnecting; }
  Transport transport() const { return link->transport(); }

  // ------------------------------------------------------------ identity
  const std::uint64_t id;
  const std::uint32_t slot;  // in BrokerCore::slots
  const std::string peer;
  std::unique_ptr<Link> link;
  const std::uint32_t peer_buffer_size;  // largest frame train the client can receive
  /// The protocol version negotiated in the handshake (SPEC.md §2.1): below
  /// 2 the client can read no header block, so its deliveries go without.
  std::uint8_t protocol_version = proto::kVersion;
  /// Mutual TLS: the CN of the client certificate the broker verified
  /// (a `certificate: true` user of that name logs in without a secret).
  std::string certificate_name;
  /// Accepted on a route listener (cluster.listen_rdma/listen_tcp): only a
  /// route may log in on it (docs/cluster.md).
  bool route_listener = false;
  /// A route this broker dialed (broker/route_events.hpp): it logs in and
  /// subscribes at its broker, and what comes back is routed here. Null for
  /// every connection that was accepted.
  std::unique_ptr<DialedRoute> dialed;

  // ------------------------------------------------------------ state
  ConnState state;
  CloseReason reason = CloseReason::kCount;
  bool close_received = false;     // the client sent CLOSE
  bool peer_disconnected = false;  // the transport's end (DISCONNECTED, FIN, connect error) was seen
  bool touched = false;            // on the worker's flush list
  bool awaits_send = false;        // RDMA: has data and a credit, waits for a send slot or block
  bool reaping = false;            // queued for destruction at the end of the loop turn
  std::chrono::steady_clock::time_point deadline{};  // draining/disconnecting: when to give up waiting

  // ------------------------------------------------------------ publisher stall
  /// A stalled publisher fed a subscriber (slot stall_slot) whose queue is
  /// above the stall watermark: its link is paused until that queue drains
  /// below half the bound, or until the queue makes no progress for
  /// producer_stall_ms (stalled_until): a subscriber that stopped reading
  /// must not hold the publisher; it overflows and is cut off instead. A
  /// stall takes effect at the frame that found the subscriber backlogged:
  /// the rest of the input waits in held_input.
  bool stalled = false;
  std::uint32_t stall_slot = 0;
  std::int64_t stall_queued = 0;  // the subscriber's queue when last seen shrinking
  std::int64_t stall_sent = 0;    // the frames sent to it when last seen sending (ConnectionSlots::sent)
  std::chrono::steady_clock::time_point stalled_until{};
  /// While the input held by a stall that waited in vain is taken, its
  /// subscriber stalls the publisher no more: what was held flows (up to a
  /// stall for another subscriber), as a batch did before frames were held.
  std::uint32_t stall_waived_slot = UINT32_MAX;

  // ------------------------------------------------------------ out-queue and in-flight ring
  std::deque<OutItem> outq;
  std::uint32_t pending_messages = 0;  // messages in outq (deliveries, not control frames)
  /// Messages in fragments whose first fragment was queued and whose last
  /// (or ABORT) was not yet: a close counts them as dropped, once each.
  std::uint32_t begun_messages = 0;
  std::uint64_t pending_bytes = 0;   // their PUBLISH frames' bytes: bounded by max_pending_bytes
  std::uint32_t queued_replies = 0;  // control frames in outq: bounded by kMaxQueuedReplies
  /// Pool buffers outq holds (its items with `pinned`): bounded by the
  /// connection's and its tenant's pool shares (broker/pool_shares.hpp).
  std::int64_t pins = 0;
  /// Items at the back of outq that no flush has left waiting yet: the next
  /// compaction looks at these (Connections::compact).
  std::uint32_t unexamined = 0;
  /// The buffer of this connection's own that waiting small messages are
  /// copied into, and how much of it is used (Connections::compact).
  BufferRef compact_buffer;
  std::uint32_t compact_used = 0;
  /// Whose share the pins count against too: the user, or an anonymous
  /// client's address (set at authentication; null before).
  std::shared_ptr<TenantUsage> tenant;
  /// Messages in fragments (subscription, publisher id) this subscriber is
  /// sent nothing more of: the first did not fit its smaller receive buffers
  /// (SPEC.md §3.7, "Smaller receive buffers"), so neither do the rest.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> uncut_messages;
  std::chrono::steady_clock::time_point last_progress{};  // last send completion, or when the queue filled
  std::vector<InflightSend> inflight;                     // ring of send_window + 1 records
  std::uint32_t inflight_head = 0;
  std::uint32_t inflight_count = 0;
  std::uint64_t next_sequence = 1;
  /// Room for another send on the in-flight ring.
  bool can_send() const { return inflight_count + 1 < inflight.size(); }
  /// The ring slot the next recorded send takes.
  std::uint32_t inflight_tail() const {
    return (inflight_head + inflight_count) % static_cast<std::uint32_t>(inflight.size());
  }

  // ------------------------------------------------------------ authentication and permissions
  std::chrono::steady_clock::time_point auth_deadline{};  // CONNECT and its verdict must come before
  /// Frames that arrived after CONNECT while its credentials are checked:
  /// taken, in order, once they are accepted (SPEC.md §2.4), dropped with the
  /// connection if not. The link stops reading meanwhile, so they are at most
  /// what the client could send before (RDMA: 2 credits; TCP: one read).
  struct HeldFrames {
    BufferRef buf;
    std::uint32_t begin = 0;
    std::uint32_t end = 0;
  };
  /// Also the frames that arrived after an RDV_OFFER while the broker reads
  /// its message (SPEC.md §3.8): taken once it is read.
  std::vector<HeldFrames> held_input;
  /// The connection's input is held back (a publisher stall, frames
  /// waiting for the login's verdict, an offer being read): its link reads
  /// nothing more (TCP) and returns no credits (RDMA) until none holds.
  bool input_held() const { return stalled || !held_input.empty() || rendezvous.open; }
  std::shared_ptr<const Identity> identity;  // set once authenticated
  /// Recent publish verdicts by subject, for users whose publish permissions
  /// are restricted (cleared when full and on reload).
  SubjectVerdicts publish_verdicts;
  RateLimit consume_rate;                  // CONSUMEs within limits.consumer_opens_per_second
  std::uint64_t denials = 0;               // operations refused by permissions (their log lines thin out)
  bool subscription_limit_logged = false;  // the subscription limit is logged once per connection

  // ------------------------------------------------------------ subscriptions
  struct Subscription {
    std::string pattern;
    Subscriber stored;  // as the index holds it (with its queue group id); a channel's: its interest only
    std::uint32_t channel = 0;    // served by this multicast channel instead (not in the index itself)
    std::uint64_t cost = 0;       // taken from BrokerCore::subscription_budget, given back when it ends
    bool tenant_charged = false;  // ... and from the tenant's quota (every client's but a route's)
    bool consumer = false;        // a stream's consumer (SPEC.md §3.11): the stream engine serves it
  };
  bool multicast_capable = false;  // RDMA client of protocol version 2 that offered kConnectMulticast
  std::unordered_map<std::uint32_t, Subscription> subscriptions;  // by sid
  /// In a cluster: the highest interest entry its subscriptions have used
  /// (broker/cluster_interest.hpp), and the PONGs held until the routes have it in
  /// effect (SPEC.md §8, "Interest in effect").
  std::uint32_t interest_through = 0;
  std::uint32_t pongs_held = 0;

  // ------------------------------------------------------------ a fragmented message in progress
  /// The message this publisher is sending as fragments (SPEC.md §3.7). Its
  /// recipients are fixed by the first fragment (a queue group's member
  /// chosen once, a subscriber that arrives later gets none of it), and
  /// every later fragment goes to them as it arrives (cut-through: the
  /// broker never holds the whole message). When it ends unfinished (the
  /// publisher leaves or sends ABORT) they get ABORT.
  struct OpenMessage {
    bool open = false;
    std::uint32_t length = 0;       // the message's payload bytes (the fragments' arg)
    std::uint32_t next_offset = 0;  // where the next fragment must start
    std::vector<Subscriber> recipients;
    bool accepted = false;  // permitted (not denied): its bytes count as received
    /// Its last fragment, or when the broker last held the publisher back:
    /// limits.fragment_timeout_ms counts from here (Connections::check_open_messages).
    std::chrono::steady_clock::time_point waiting_since{};
  };
  OpenMessage open_message;

  // ------------------------------------------------------------ a rendezvous offer being read
  /// Protocol version 8 over RDMA (SPEC.md §3.8): the message of an
  /// RDV_OFFER, which the broker READs from the publisher's registered
  /// region into pool buffers laid out as the fragments of §3.7 and routes
  /// as they arrive (open_message holds its recipients, as for fragments the
  /// client sent). At most kMaxReads READs in flight; the connection's other
  /// frames wait until the whole region is read, then RDV_RELEASE tells the
  /// client it may let the region go.
  struct RendezvousRead {
    static constexpr std::uint32_t kMaxReads = 2;
    bool open = false;
    std::uint64_t offer = 0;  // the offer's sequence, echoed in RDV_RELEASE
    std::uint64_t address = 0;
    std::uint32_t rkey = 0;
    std::uint32_t length = 0;  // the message's bytes (the offer's arg)
    std::uint32_t posted = 0;  // bytes whose READ was posted
    std::uint32_t routed = 0;  // bytes read and routed
    std::uint32_t reads = 0;   // READs in flight
    std::uint16_t flags = 0;   // REQUEST, for the first fragment
    std::uint16_t header_len = 0;
    std::string subject;
    std::string reply;
  };
  RendezvousRead rendezvous;
  /// The smallest message the accept allowed it to offer (0: no rendezvous),
  /// and from version 9 the smallest it may take into a landing area.
  std::uint32_t rendezvous_min = 0;

  // ------------------------------------------------------------ landing areas (SPEC.md §3.9)
  /// A message in fragments of at least rendezvous_min bytes that this
  /// subscriber (version 9 over RDMA) is being sent: from the pack of its
  /// first fragment's DELIVER to that of its last (or of its ABORT). Once
  /// the client's RDV_READY names its landing area, the fragments between
  /// go by RDMA WRITE into it instead of as DELIVERs (RdmaLink::flush).
  struct Landing {
    std::uint32_t sid = 0;
    std::uint64_t publisher = 0;
    std::uint64_t first_sequence = 0;  // its first fragment's DELIVER: what RDV_READY names
    std::uint64_t address = 0;         // of the message's byte 0, once ready (0: the client named none)
    std::uint32_t rkey = 0;
    bool ready = false;  // the client answered
  };
  /// One per message in progress to it (each begun by a publisher's open
  /// message, so as many as those at most).
  std::vector<Landing> landings;
  Landing* landing_for(std::uint32_t sid, std::uint64_t publisher) {
    for (auto& l : landings)
      if (l.sid == sid && l.publisher == publisher) return &l;
    return nullptr;
  }
  /// Its connect request said it answers every first fragment (LANDING,
  /// SPEC.md §3.9): the rest of such a message waits for its RDV_READY.
  bool answers_landings = false;
  /// Whether deliveries to it may land (the accept of version 9 allowed it).
  bool takes_landings() const {
    return rendezvous_min != 0 && protocol_version >= proto::kLandingVersion && identity && !identity->route;
  }

  // ------------------------------------------------------------ traffic (rdmabroker stat)
  std::uint64_t messages_in = 0;  // PUBLISH frames accepted
  std::uint64_t bytes_in = 0;     // their payload bytes
  std::uint64_t messages_out = 0;
  std::uint64_t bytes_out = 0;
};

inline Connection::Connection(std::uint64_t id_, std::uint32_t slot_, std::string peer_,
                              std::unique_ptr<Link> link_, std::uint32_t peer_buffer_size_,
                              std::uint32_t send_window, ConnState initial)
    : id(id_),
      slot(slot_),
      peer(std::move(peer_)),
      link(std::move(link_)),
      peer_buffer_size(peer_buffer_size_),
      state(initial),
      inflight(send_window + 1) {
  link->bind(*this);
}

}  // namespace rdmabroker::daemon
