// A worker thread: one event loop that owns, per device, a completion channel,
// a CQ and an SRQ, and owns every connection handed to it (its QP and cm_id).
// No other thread touches these; they reach the worker through its command
// queue. Loop order (run()): commands, CM events, completions (receive ->
// route, send -> release), flush of touched connections, SRQ refill, deadlines;
// then re-arm, drain once more, and sleep in epoll.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "broker/close_reason.hpp"
#include "broker/connection_slots.hpp"
#include "broker/options.hpp"
#include "broker/outbound.hpp"
#include "broker/stats.hpp"
#include "broker/subscription_index.hpp"
#include "rdma/buffer_pool.hpp"
#include "rdma/command_queue.hpp"
#include "rdma/device.hpp"
#include "rdmabroker/common/credits.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

class Worker;

/// What every worker shares; owned by the Broker, outlives all workers.
struct BrokerCore {
  BrokerOptions options;
  BufferPool* pool = nullptr;
  DeviceSet* devices = nullptr;
  SubscriptionIndex index;
  std::vector<Worker*> workers;
  std::unique_ptr<ConnectionSlots> slots;  // one per open connection, all workers
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
};
struct ShutdownCommand {};
using Command = std::variant<AcceptCommand, DeliverCommand, QpFatalCommand, ShutdownCommand>;

// ---------------------------------------------------------------- connection

enum class ConnState {
  kAccepting,      // QP created, rdma_accept sent, waiting for ESTABLISHED
  kEstablished,
  kDraining,       // closing: flushing its last frames (an ERROR or CLOSE)
  kDisconnecting,  // rdma_disconnect done: waiting for flushes and DISCONNECTED
};

constexpr std::string_view to_string(ConnState s) {
  switch (s) {
    case ConnState::kAccepting: return "accepting";
    case ConnState::kEstablished: return "established";
    case ConnState::kDraining: return "draining";
    case ConnState::kDisconnecting: return "disconnecting";
  }
  return "unknown";
}

struct DevicePort;

/// One SEND posted and not yet completed, with what it references.
struct InflightSend {
  std::uint32_t block = 0;  // send block index, or kNoBlock for a credit update
  std::uint32_t frames = 0;
  std::uint32_t deliveries = 0;          // DELIVER frames among them
  std::uint64_t delivered_payload = 0;   // their payload bytes
  std::array<BufferRef, kMaxFramesPerSend> refs;
};

struct Connection {
  std::uint64_t id = 0;
  std::uint32_t slot = 0;          // in BrokerCore::slots
  DevicePort* port = nullptr;
  std::string peer;
  verbs::CmIdPtr cm_id;  // declared first: destroyed after the QP
  verbs::CmQp qp;
  std::uint32_t qp_num = 0;
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
  CreditWindow credits;
  std::deque<OutItem> outq;
  std::uint32_t pending_messages = 0;  // messages in outq (deliveries, not control frames)
  std::uint64_t pending_bytes = 0;     // their PUBLISH frames' bytes: bounded by max_pending_bytes
  std::chrono::steady_clock::time_point last_progress{};  // last send completion, or when the queue filled
  std::vector<InflightSend> inflight;  // ring
  std::uint32_t inflight_head = 0;
  std::uint32_t inflight_count = 0;
  std::uint64_t next_sequence = 1;
  std::unordered_map<std::uint32_t, std::string> subscriptions;  // sid -> subject
};

/// A worker's resources on one device.
struct DevicePort {
  Device* device = nullptr;
  verbs::CompChannelPtr channel;  // members in creation order; reverse is a valid teardown
  verbs::CqPtr cq;
  verbs::CqEventAcker acker;      // acks before the CQ is destroyed
  verbs::SrqPtr srq;
  verbs::MrPtr send_blocks_mr;    // the worker's send blocks registered on this device
  std::uint32_t max_sge = 1;
  std::uint32_t srq_depth = 0;
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
  Status init();
  void start();
  void join();

  /// Any thread.
  void post(Command cmd) { commands_.post(std::move(cmd)); }
  rdma_event_channel* cm_channel() const { return cm_channel_.get(); }
  std::uint32_t index() const { return index_; }
  const WorkerStats& stats() const { return stats_; }

 private:
  static constexpr std::uint32_t kNoBlock = ~0u;
  static constexpr std::uint64_t kRecvFlag = 1ull << 63;

  void run();
  bool poll_port(DevicePort& port);
  void arm_and_wait(int timeout_ms);
  void handle_commands();
  void handle_cm_events();
  void handle_accept(AcceptCommand& cmd);
  /// Accepting -> Established, on the CM event or on the first receive,
  /// whichever the worker sees first (they travel on different channels).
  void establish(Connection& c);
  void reject(rdma_cm_id* id, proto::RejectReason reason);

  void on_receive(DevicePort& port, const ibv_wc& wc);
  void on_send_complete(DevicePort& port, const ibv_wc& wc);
  void process_frames(Connection& c, const BufferRef& buf, std::uint32_t len);
  void route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf);
  void enqueue(Connection& c, OutItem item);
  /// Messages for `slot` left the broker's queues (sent or dropped).
  void unqueue(std::uint32_t slot, std::uint64_t bytes) { core_.slots->add_queued(slot, -static_cast<std::int64_t>(bytes)); }
  /// Cuts off subscribers that have queued data and accepted nothing for write_deadline_ms.
  void check_write_deadlines();
  /// Queues one routed PUBLISH frame for `c`, extending its last DELIVER run if possible.
  void deliver_local(Connection& c, const BufferRef& buf, std::uint32_t sid, const proto::Frame& f);
  void post_remote_batches();

  void touch(Connection& c);
  void flush_touched();
  void flush(Connection& c);
  bool post_send(Connection& c, std::uint32_t block, const ibv_sge* sge, std::uint32_t num_sge,
                 std::uint32_t imm, std::array<BufferRef, kMaxFramesPerSend>* refs, const PackedSend& packed);
  /// Retires the oldest in-flight SEND; its deliveries count as delivered or dropped.
  void retire_send(Connection& c, bool success);
  std::uint32_t take_credits_to_return(Connection& c);

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
  const BrokerOptions& opt_;
  WorkerStats stats_;

  // Send blocks: registered memory for frame headers and control frames.
  std::unique_ptr<std::byte[]> send_blocks_;  // before ports_: MRs go first
  std::vector<std::uint32_t> free_blocks_;

  verbs::EventChannelPtr cm_channel_;  // before connections_: ids are destroyed first
  CommandQueue<Command> commands_;
  UniqueFd epoll_;
  std::vector<std::unique_ptr<DevicePort>> ports_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Connection>> connections_;  // last: destroyed first

  std::vector<Connection*> touched_;
  std::vector<std::uint64_t> closing_;  // draining or disconnecting: deadlines to check
  std::vector<std::uint64_t> reap_;     // to destroy at the end of the loop turn
  std::vector<std::uint64_t> stalled_;  // publishers whose credits are withheld for a while
  std::chrono::steady_clock::time_point now_{};  // refreshed once per loop turn
  std::chrono::steady_clock::time_point next_write_check_{};
  std::vector<std::vector<RemoteDelivery>> remote_;  // per target worker
  MatchCache match_cache_;  // this worker's recent subject -> subscribers results
  std::vector<Command> command_scratch_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace rdmabroker::daemon
