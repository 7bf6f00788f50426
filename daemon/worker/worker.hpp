// A worker thread: one event loop that owns, per device, a completion channel,
// a CQ and an SRQ, and owns every connection handed to it: RDMA ones (their QP
// and cm_id) and TCP ones (their socket). No other thread touches these; they
// reach the worker through its command queue. Loop order (run()): commands, CM
// events, completions (receive -> route, send -> release), ready sockets,
// flush of touched connections, SRQ refill, deadlines; then re-arm, drain once
// more, and sleep in epoll. Both transports share everything above the
// transport: frames, routing, queues, bounds, the close state machine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <sys/uio.h>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "broker/auth.hpp"
#include "broker/close_reason.hpp"
#include "broker/connection_slots.hpp"
#include "broker/options.hpp"
#include "broker/outbound.hpp"
#include "broker/stats.hpp"
#include "broker/subscription_budget.hpp"
#include "broker/subscription_index.hpp"
#include "fault/fault.hpp"
#include "multicast/engine.hpp"
#include "rdma/buffer_pool.hpp"
#include "worker/command_queue.hpp"
#include "rdma/device.hpp"
#include "rdmabroker/common/credits.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

class Worker;

/// Heap a queued delivery may cost besides its frame bytes (its OutItem and
/// queue slot; the payload itself sits in the registered pool): charged per
/// message against limits.max_pending_bytes_total, so that the bound holds
/// for heap too whatever the message size.
inline constexpr std::int64_t kQueuedMessageCharge = 128;
static_assert(sizeof(OutItem) + 16 <= kQueuedMessageCharge, "a queued message costs more than it is charged");
/// What `messages` queued deliveries of `bytes` frame bytes are charged.
constexpr std::int64_t queued_charge(std::int64_t bytes, std::int64_t messages) {
  return bytes + kQueuedMessageCharge * messages;
}

/// What every worker shares; owned by the Broker, outlives all workers.
struct BrokerCore {
  BrokerOptions options;
  BufferPool* pool = nullptr;
  DeviceSet* devices = nullptr;
  SubscriptionIndex index;
  std::vector<Worker*> workers;
  std::unique_ptr<ConnectionSlots> slots;  // one per open connection, all workers
  SubscriptionBudget subscription_budget;  // limits.max_subscriptions_total / max_subscription_memory
  std::atomic<std::uint64_t> next_connection_id{1};  // broker-wide, both transports
  std::shared_ptr<const AuthTable> auth;             // as started; reloads hand workers their successors
  Authenticator* authenticator = nullptr;            // checks passwords and tokens off the workers
  fault::Shared faults;                              // test builds: faults any worker may pick up
  MulticastEngine* multicast = nullptr;              // null: multicast off (or no RDMA device)
  /// The slot whose count is the multicast engine's backlog: messages
  /// workers routed to channels that the engine has not handled yet
  /// (messages, not bytes: each costs the engine at least one datagram).
  std::uint32_t multicast_slot = 0;
  /// The backlog's bound: publishers feeding channels are slowed above three
  /// quarters of it, as for a backlogged subscriber. A quarter of the
  /// retransmit window: a gap's repair request waits behind the backlog, and
  /// must be answered before the window has moved past the gap.
  std::uint64_t multicast_backlog = 1024;

  /// What queued deliveries on every worker are charged against
  /// limits.max_pending_bytes_total: frame bytes + kQueuedMessageCharge per message.
  std::int64_t pending_charge_total() const;

  /// The queue bound that slows publishers for `slot` (a connection's, or the engine's).
  std::uint64_t backlog_bound(std::uint32_t slot, std::uint64_t max_pending_bytes) const {
    return multicast != nullptr && slot == multicast_slot ? multicast_backlog : max_pending_bytes;
  }

  /// Posts each worker its deliveries (one DeliverCommand per worker with
  /// any) and leaves `per_worker` empty: how workers and the multicast engine
  /// hand messages to connections they do not own.
  void post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker) const;

  /// The worker that owns RDMA connection `id`: the listener spreads them
  /// round-robin by id (a TCP connection stays with the worker that accepted it).
  Worker& rdma_owner(std::uint64_t id) const { return *workers[id % workers.size()]; }
};

// ---------------------------------------------------------------- commands

/// A connect request the listener validated; the worker creates the QP and
/// accepts. Ownership of the cm_id moves with the command.
struct AcceptCommand {
  rdma_cm_id* id = nullptr;
  proto::ConnectRequest request;
  std::uint64_t connection_id = 0;
  std::uint32_t slot = 0;
  std::string peer;
};
/// Deliveries routed on another worker to this worker's connections.
struct RemoteDelivery {
  std::uint64_t connection = 0;
  std::uint32_t slot = 0;
  OutItem item;
};
struct DeliverCommand {
  std::vector<RemoteDelivery> items;
};
/// An asynchronous QP error reported on the device's async event fd.
struct QpFatalCommand {
  std::uint64_t connection_id = 0;
  std::string event;
  /// IBV_EVENT_QP_LAST_WQE_REACHED: the QP left for the error state. News
  /// only for a connection that is open; closing ones cause it themselves.
  bool only_if_open = false;
};
struct ShutdownCommand {};
/// The authenticator's verdict on a connection's CONNECT.
struct AuthResultCommand {
  std::uint64_t connection_id = 0;
  std::shared_ptr<const Identity> identity;  // null: refused
  std::string error;                         // why, as the client is told
};
/// A reload's settings: the worker takes the live ones (config::diff's
/// `live` keys) into its own copy; the others cannot have changed.
struct ReloadCommand {
  BrokerOptions options;
  std::shared_ptr<const AuthTable> auth;        // users and permissions now
  std::shared_ptr<std::promise<void>> applied;  // set once the worker uses them
};
/// One connection as `rdmabroker stat` shows it.
struct ConnectionInfo {
  std::uint64_t id = 0;
  std::string transport;
  std::string peer;
  std::string state;
  std::string user;  // empty until authenticated
  std::uint32_t worker = 0;
  std::size_t subscriptions = 0;
  std::uint64_t messages_in = 0;
  std::uint64_t messages_out = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t pending_messages = 0;
  std::uint64_t pending_bytes = 0;
};
/// Asks a worker for its connections; it answers through the promise.
struct ListConnectionsCommand {
  std::shared_ptr<std::promise<std::vector<ConnectionInfo>>> reply;
};
/// Test builds (fault.hpp): a fault aimed at one of this worker's connections.
struct FaultCommand {
  fault::Spec spec;
  std::shared_ptr<std::promise<Status>> reply;
};
using Command = std::variant<AcceptCommand, DeliverCommand, QpFatalCommand, ShutdownCommand, ReloadCommand,
                             ListConnectionsCommand, AuthResultCommand, FaultCommand>;

// ---------------------------------------------------------------- connection

enum class Transport : std::uint8_t { kRdma, kTcp };

constexpr std::string_view to_string(Transport t) { return t == Transport::kRdma ? "rdma" : "tcp"; }

enum class ConnState {
  kAccepting,  // RDMA: QP created, rdma_accept sent, waiting for ESTABLISHED
  kEstablished,
  kDraining,       // closing: flushing its last frames (an ERROR or CLOSE)
  kDisconnecting,  // rdma_disconnect done: waiting for flushes and DISCONNECTED
};

constexpr std::string_view to_string(ConnState s) {
  switch (s) {
    case ConnState::kAccepting:
      return "accepting";
    case ConnState::kEstablished:
      return "established";
    case ConnState::kDraining:
      return "draining";
    case ConnState::kDisconnecting:
      return "disconnecting";
  }
  return "unknown";
}

/// Lets a map keyed by std::string be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// Where a connection is in authentication (SPEC.md §2.4): its first frame
/// must be CONNECT; until the verdict only PING (answered after it), CREDIT
/// and CLOSE may follow.
enum class AuthPhase : std::uint8_t {
  kAwaitingConnect,
  kVerifying,  // the authenticator thread is checking the credentials
  kDone,
};

struct DevicePort;

/// One SEND posted and not yet completed, with what it references.
struct InflightSend {
  std::uint32_t block = 0;  // send block index, or kNoBlock for a credit update
  std::uint32_t frames = 0;
  std::int64_t oldest_received_at = 0;  // for the relay latency histogram
  std::uint32_t deliveries = 0;         // DELIVER frames among them
  std::uint64_t delivered_payload = 0;  // their payload bytes
  std::array<BufferRef, kMaxFramesPerSend> refs;
};

/// A TCP connection's socket state (SPEC.md §1.2): what is read accumulates in
/// a pool buffer so that routed frames are referenced, not copied, exactly as
/// with an RDMA receive; what is written is one packed send at a time.
struct TcpState {
  UniqueFd fd;
  BufferRef rbuf;  // frames [rstart, rlen) not yet processed
  std::uint32_t rstart = 0;
  std::uint32_t rlen = 0;
  bool reading = true;                   // EPOLLIN wanted (false while stalled or short of buffers)
  bool writing = false;                  // EPOLLOUT wanted (a write hit EAGAIN)
  std::array<iovec, kMaxSendSge> iov{};  // the in-flight send's remaining pieces
  std::uint32_t iov_next = 0;
  std::uint32_t iov_count = 0;
};

struct Connection {
  std::uint64_t id = 0;
  std::uint32_t slot = 0;  // in BrokerCore::slots
  Transport transport = Transport::kRdma;
  DevicePort* port = nullptr;  // RDMA only
  std::string peer;
  verbs::CmIdPtr cm_id;  // declared first: destroyed after the QP
  verbs::CmQp qp;
  std::uint32_t qp_num = 0;
  std::uint32_t max_inline = 0;  // RDMA: bytes a SEND may carry inline (the QP's cap)
  TcpState tcp;                  // TCP only
  ConnState state = ConnState::kAccepting;
  CloseReason reason = CloseReason::kCount;
  bool close_received = false;     // the client sent CLOSE
  bool peer_disconnected = false;  // DISCONNECTED (or a connect error) was seen
  bool touched = false;            // on the worker's flush list
  bool reaping = false;            // queued for destroy() at the end of the loop turn
  std::chrono::steady_clock::time_point deadline{};
  /// A stalled publisher fed a subscriber (slot stall_slot) whose queue is
  /// above the stall watermark: its credits are withheld until that queue
  /// drains below half the bound, or until the queue makes no progress for
  /// producer_stall_ms (stalled_until): a subscriber that stopped reading
  /// must not hold the publisher; it overflows and is cut off instead.
  bool stalled = false;
  std::uint32_t stall_slot = 0;
  std::int64_t stall_queued = 0;  // the subscriber's queue when last seen shrinking
  std::chrono::steady_clock::time_point stalled_until{};
  std::uint32_t peer_buffer_size = 0;  // largest SEND the client can receive
  CreditWindow credits;                // RDMA only: TCP's own window does this job
  std::deque<OutItem> outq;
  std::uint32_t pending_messages = 0;  // messages in outq (deliveries, not control frames)
  std::uint64_t pending_bytes = 0;     // their PUBLISH frames' bytes: bounded by max_pending_bytes
  std::uint32_t queued_replies = 0;    // control frames in outq: bounded by kMaxQueuedReplies
  std::chrono::steady_clock::time_point last_progress{};  // last send completion, or when the queue filled
  std::vector<InflightSend> inflight;                     // ring (TCP: at most one, being written)
  std::uint32_t inflight_head = 0;
  std::uint32_t inflight_count = 0;
  std::uint64_t next_sequence = 1;
  AuthPhase auth = AuthPhase::kAwaitingConnect;
  std::chrono::steady_clock::time_point auth_deadline{};  // CONNECT and its verdict must come before
  std::uint32_t deferred_pongs = 0;                       // PINGs that arrived while verifying
  std::shared_ptr<const Identity> identity;               // set once authenticated
  /// Recent publish verdicts by subject, for users whose publish permissions
  /// are restricted (cleared when full and on reload).
  std::unordered_map<std::string, bool, StringHash, std::equal_to<>> publish_verdicts;
  bool fail_next_wc = false;  // test builds: fault wc-error armed on this connection
  std::uint64_t denials = 0;
  bool subscription_limit_logged =
      false;  // operations refused by permissions (their log lines are thinned out)
  // Traffic of this connection (for `rdmabroker stat`): PUBLISH frames in,
  // deliveries sent out, and their payload bytes.
  std::uint64_t messages_in = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t messages_out = 0;
  std::uint64_t bytes_out = 0;
  struct Subscription {
    std::string pattern;
    Subscriber stored;          // as the index holds it (with its queue group id)
    std::uint32_t channel = 0;  // served by this multicast channel instead (not in the index itself)
    std::uint64_t cost = 0;     // taken from BrokerCore::subscription_budget, given back when it ends
  };
  bool multicast_capable = false;  // RDMA client that offered kConnectMulticast
  std::unordered_map<std::uint32_t, Subscription> subscriptions;  // by sid
};

/// A worker's resources on one device.
struct DevicePort {
  Device* device = nullptr;
  verbs::CompChannelPtr channel;  // members in creation order; reverse is a valid teardown
  verbs::CqPtr cq;
  verbs::CqEventAcker acker;  // acks before the CQ is destroyed
  verbs::SrqPtr srq;
  verbs::MrPtr send_blocks_mr;  // the worker's send blocks registered on this device
  std::uint32_t max_sge = 1;
  std::uint32_t srq_depth = 0;
  /// CQ entries, and those spoken for: the SRQ's receives plus a send window
  /// (max_inflight_sends + 1) per connection. A connection that would
  /// overrun the CQ is refused: an overrun CQ breaks every QP on it.
  std::uint32_t cq_capacity = 0;
  std::uint32_t cq_reserved = 0;
  std::uint32_t posted = 0;       // receives on the SRQ
  std::uint32_t outstanding = 0;  // credits granted to this port's clients, not yet used
  bool armed = false;
  std::vector<std::uint8_t> posted_flag;  // by pool index: buffers sitting on this SRQ
  std::unordered_map<std::uint32_t, Connection*> by_qp;

  /// Receives that no client has a credit for: what may still be granted.
  std::uint32_t credit_budget() const { return posted > outstanding ? posted - outstanding : 0; }
};

// ---------------------------------------------------------------- worker

class Worker {
 public:
  Worker(std::uint32_t index, BrokerCore& core);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Creates the per-device resources (calling thread, before start()).
  /// `tcp_listen_fd`: the broker's listening socket, shared by all workers
  /// (EPOLLEXCLUSIVE wakes one), or -1.
  Status init(int tcp_listen_fd);
  void start();
  void join();

  /// Any thread.
  void post(Command cmd) { commands_.post(std::move(cmd)); }
  rdma_event_channel* cm_channel() const { return cm_channel_.get(); }
  std::uint32_t index() const { return index_; }
  const WorkerStats& stats() const { return stats_; }
  /// When the loop last went round (steady clock, ns): the watchdog's view of health.
  std::int64_t heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint32_t kNoBlock = ~0u;
  /// From establishment to an accepted CONNECT (the verdict included).
  static constexpr std::chrono::seconds kAuthTimeout{10};
  /// Replies (PONG, ERROR, NO_RESPONDERS) a connection may have queued and
  /// unsent. max_pending_bytes bounds deliveries only; without this a client
  /// that keeps asking (PINGs, denied publishes, requests nobody serves) and
  /// never reads would grow its queue without limit. Beyond it the client is
  /// cut off as a slow consumer.
  static constexpr std::uint32_t kMaxQueuedReplies = 1024;
  static constexpr std::uint64_t kRecvFlag = 1ull << 63;
  // epoll user data: which fd woke us. Device ports use their index (< 2^32).
  static constexpr std::uint64_t kTagCommands = 1ull << 62;
  static constexpr std::uint64_t kTagCm = 1ull << 61;
  static constexpr std::uint64_t kTagTcpListen = 1ull << 60;
  static constexpr std::uint64_t kTagHandshake = 1ull << 59;      // | fd
  static constexpr std::uint64_t kTagTcpConnection = 1ull << 58;  // | connection id (< 2^58)
  static constexpr std::uint64_t kTagMask = 0x3full << 58;

  void run();
  bool poll_port(DevicePort& port);
  /// Waits up to timeout_ms (0: just looks) for any fd and handles what is
  /// ready: sockets at once, completion channels by re-enabling their polls.
  void wait_events(int timeout_ms);
  void handle_commands();
  /// Busy polling: spins on the CQs until one has work or flow.busy_poll_us
  /// has passed since the last work; true when it found some.
  bool spin_poll();
  void handle_cm_events();
  /// One CM event of a connection (copied out of the acked rdma_cm_event).
  void on_cm_event(rdma_cm_event_type type, int status, std::uint64_t conn_id);
  /// Test builds: fault commands, failed completions, late CM events.
  void on_fault(FaultCommand& f);
  void inject_wc_fault(ibv_wc& wc, DevicePort& port);
  void deliver_delayed_cm_events();
  /// The pool gave a refill nothing: logged and counted once per shortage.
  void note_pool_starved(bool starved);
  void handle_accept(AcceptCommand& cmd);
  /// Accepting -> Established, on the CM event or on the first receive,
  /// whichever the worker sees first (they travel on different channels).
  void establish(Connection& c);
  void reject(rdma_cm_id* id, proto::RejectReason reason);

  // Authentication and permissions (worker/access.cpp)
  /// A frame of a connection that is not authenticated yet; false if it closed.
  bool before_authentication(Connection& c, const proto::Frame& f);
  void on_auth_result(AuthResultCommand& r);
  /// Reload: renews every identity from the new table; revokes subscriptions
  /// and connections that lost their permission.
  void apply_auth(std::shared_ptr<const AuthTable> table);
  bool may_publish(Connection& c, std::string_view subject);
  /// ERROR(PERMISSION_DENIED) to the client, a log line, a count.
  void deny(Connection& c, std::string_view operation, std::string_view subject, std::uint32_t sid);
  void check_auth_deadlines();

  void on_receive(DevicePort& port, const ibv_wc& wc);
  void on_send_complete(DevicePort& port, const ibv_wc& wc);
  /// Handles the whole frames in [begin, end) of `buf`; the caller guarantees
  /// they are whole (a SEND, or a TCP read's complete prefix).
  void process_frames(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end);
  void route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf);
  /// Queues one frame for `s`, locally or through its worker; false if it went nowhere (counted).
  bool route_to(const Subscriber& s, const proto::Frame& f, const BufferRef& buf);
  /// False only for a subscriber of this worker that is gone or closing.
  bool is_live(const Subscriber& s);
  void enqueue(Connection& c, OutItem item);
  /// Messages for `slot` left the broker's queues (sent or dropped).
  void unqueue(std::uint32_t slot, std::uint64_t bytes) {
    core_.slots->add_queued(slot, -static_cast<std::int64_t>(bytes));
  }
  /// Cuts off subscribers that have queued data and accepted nothing for write_deadline_ms.
  void check_write_deadlines();
  /// Queues one routed PUBLISH frame for `c`, extending its last DELIVER run if possible.
  void deliver_local(Connection& c, const BufferRef& buf, std::uint32_t sid, const proto::Frame& f);
  void post_remote_batches();
  /// Adds a subscription to the index, or to its subject's multicast channel.
  /// `cost` was taken from the broker-wide budget for it (given back by drop_subscription).
  void add_subscription(Connection& c, const proto::Frame& f, std::uint64_t cost);
  /// Whether `len` more bytes may queue for `c`: within limits.max_pending_bytes, and above
  /// fair_pending_share() only while the broker-wide total stays within limits.max_pending_bytes_total.
  bool may_queue(const Connection& c, std::uint64_t len, std::uint32_t messages = 1) const;
  /// A connection's share of limits.max_pending_bytes_total: total / max_connections.
  std::uint64_t fair_pending_share() const;
  /// TOO_MANY_SUBSCRIPTIONS for subscription `sid`: the broker-wide budget is spent.
  void refuse_subscription_broker_wide(Connection& c, std::uint32_t sid, SubscriptionBudget::Refusal refusal);
  void drop_subscription(Connection& c, const Connection::Subscription& sub, std::uint32_t sid);
  /// MCAST_JOINED and MCAST_REPAIR; false if the connection was closed for it.
  bool on_multicast_frame(Connection& c, const proto::Frame& f);

  void touch(Connection& c);
  void flush_touched();
  void flush(Connection& c);
  void flush_rdma(Connection& c);
  /// Packs the front of c's queue into a send block: the shared part of both
  /// transports' flush. Returns the block, or kNoBlock (nothing fits/no block).
  std::uint32_t pack_next(Connection& c, std::uint32_t max_sge, std::uint32_t block_lkey,
                          std::uint32_t body_lkey, ibv_sge* sge,
                          std::array<BufferRef, kMaxFramesPerSend>& refs, PackedSend& packed);
  /// Records a send on c's in-flight ring (what it references, for retire_send).
  InflightSend& record_send(Connection& c, std::uint32_t block,
                            std::array<BufferRef, kMaxFramesPerSend>* refs, const PackedSend& packed);
  /// Records a send and adds its WR to staged_; post_staged() posts them all.
  void stage_send(Connection& c, std::uint32_t block, const ibv_sge* sge, std::uint32_t num_sge,
                  std::uint32_t imm, std::array<BufferRef, kMaxFramesPerSend>* refs,
                  const PackedSend& packed);
  /// Posts c's staged sends as one chain, the last one signaled; on failure
  /// undoes what was not posted and closes the connection.
  void post_staged(Connection& c);
  /// Retires the oldest in-flight SEND; its deliveries count as delivered or dropped.
  void retire_send(Connection& c, bool success);
  /// Releases what one send record references and counts its deliveries as
  /// delivered or dropped; retire_send() (ring head) and post_staged()'s undo
  /// of sends never posted (ring tail) share it.
  void release_send(Connection& c, InflightSend& rec, bool success);
  /// After a send completed (RDMA) or was fully written (TCP): connections
  /// that found no free send block get flushed again.
  void wake_block_waiters();
  std::uint32_t take_credits_to_return(Connection& c);

  // TCP (tcp/tcp_io.cpp)
  void accept_tcp();
  void on_handshake_readable(int fd);
  void on_tcp_event(Connection& c, std::uint32_t events);
  void read_tcp(Connection& c);
  /// A pool buffer for c's reads, or none (then c waits, not reading, for buffers to come back).
  BufferRef read_buffer(Connection& c);
  void flush_tcp(Connection& c);
  /// Writes what remains of the in-flight send; false if it must wait (EPOLLOUT) or failed.
  bool write_tcp(Connection& c);
  void update_tcp_events(Connection& c);
  /// Publisher flow control: RDMA withholds credits, TCP stops reading.
  void pause_reading(Connection& c);
  void resume_reading(Connection& c);
  void tcp_lost(Connection& c, const char* what, int err);
  void check_handshake_deadlines();
  void retry_buffer_waiters();

  void refill_srqs();
  void check_deadlines();

  /// The single teardown path. `code` != kNone sends ERROR/CLOSE first.
  void close(Connection& c, CloseReason reason, proto::ErrorCode code = proto::ErrorCode::kNone,
             std::string message = {});
  void disconnect(Connection& c);
  void drop_queue(Connection& c, DropReason why);
  void try_finish(Connection& c);
  void reap();
  void destroy(Connection& c);
  void remove_subscriptions(Connection& c);

  Connection* find(std::uint64_t id);
  std::span<std::byte> block_span(std::uint32_t block) {
    return {send_blocks_.get() + std::size_t{block} * kSendBlockSize, kSendBlockSize};
  }

  const std::uint32_t index_;
  BrokerCore& core_;
  BrokerOptions opt_;                           // this worker's copy: reloads update the live settings
  std::shared_ptr<const AuthTable> auth_;       // this worker's version of the users
  std::vector<std::uint64_t> unauthenticated_;  // connections with an authentication deadline
  std::atomic<std::int64_t> heartbeat_{0};
  WorkerStats stats_;

  // Send blocks: registered memory for frame headers and control frames.
  std::unique_ptr<std::byte[]> send_blocks_;           // before ports_: MRs go first
  std::chrono::steady_clock::time_point last_work_{};  // the last loop turn that found completions
  std::vector<std::uint32_t> free_blocks_;
  /// One connection's sends being chained by flush_rdma() (reused; reserved
  /// for max_inflight_sends + 1 so WR pointers stay put while chaining).
  struct StagedSend {
    ibv_send_wr wr{};
    std::array<ibv_sge, kMaxSendSge> sge{};
    std::uint32_t frames = 0;
  };
  std::vector<StagedSend> staged_;

  verbs::EventChannelPtr cm_channel_;  // before connections_: ids are destroyed first (null without RDMA)
  CommandQueue<Command> commands_;
  UniqueFd epoll_;
  std::vector<std::unique_ptr<DevicePort>> ports_;
  int tcp_listen_fd_ = -1;  // the Broker's; watched, never closed here
  /// TCP sockets accepted and waiting for their 16-byte connect request.
  struct Handshake {
    UniqueFd fd;
    std::uint32_t slot = 0;
    std::string peer;
    std::array<std::byte, proto::kConnectRequestSize> bytes{};
    std::uint32_t got = 0;
    std::chrono::steady_clock::time_point deadline{};
  };
  std::unordered_map<int, Handshake> handshakes_;  // by fd
  std::vector<std::uint64_t> buffer_waiters_;      // TCP connections that found the pool empty
  std::unordered_map<std::uint64_t, std::unique_ptr<Connection>> connections_;  // last: destroyed first

  std::vector<Connection*> touched_;
  std::vector<std::uint64_t> closing_;           // draining or disconnecting: deadlines to check
  std::vector<std::uint64_t> reap_;              // to destroy at the end of the loop turn
  std::vector<std::uint64_t> stalled_;           // publishers whose credits are withheld for a while
  std::chrono::steady_clock::time_point now_{};  // refreshed once per loop turn
  std::chrono::steady_clock::time_point next_write_check_{};
  std::chrono::steady_clock::time_point next_socket_check_{};  // busy loop: when to look at sockets
  std::vector<std::vector<RemoteDelivery>> remote_;            // per target worker
  std::vector<ChannelPublish> channel_batch_;  // for the multicast engine, posted after remote_
  MatchCache match_cache_;                     // this worker's recent subject -> subscribers results
  std::vector<Command> command_scratch_;
  bool stopping_ = false;
  bool pool_starved_ = false;          // the last refill found the pool empty
  std::uint32_t wc_faults_armed_ = 0;  // test builds: connections with fail_next_wc
  struct DelayedCmEvent {
    std::chrono::steady_clock::time_point due;
    rdma_cm_event_type type;
    int status;
    std::uint64_t conn_id;
  };
  std::vector<DelayedCmEvent> delayed_cm_;  // test builds: fault cm-delay
  std::thread thread_;
};

}  // namespace rdmabroker::daemon
