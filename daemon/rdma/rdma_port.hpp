// SPDX-License-Identifier: Apache-2.0
// A worker's resources on one RDMA device: a completion channel, a receive
// CQ and a send CQ shared by every QP of the worker on that device, an SRQ
// fed from the broker's pool, and the worker's send blocks registered there.
// The port drains its CQs (receives go to the frame handler, send
// completions retire the connection's in-flight sends) and refills its SRQ
// at a low watermark. The receive CQ is armed whenever the loop sleeps (an
// arrival is work); the send CQ only while something waits on a send, so
// that a delivery's completion wakes nobody: it is reaped on the next turn.
//
// Credits by demand (SPEC.md §5.1): the windows of the port's connections
// together never exceed what its SRQ may hold (srq_max), and the SRQ is kept
// filled to their sum plus some slack, within srq_depth .. srq_max. A
// version-3 connection starts at 2 credits, grows while it publishes (up to
// flow.credits, or its fair share when many publish), and is asked to give
// credits back after a second without data; an older connection gets
// flow.credits at its login (or what is left then) and keeps it.
// Owned by the worker, used only on its thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "connection/port.hpp"
#include "connection/worker_context.hpp"
#include "rdma/device.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class FrameHandler;
class RdmaLink;

class RdmaPort final : public Port {
 public:
  /// Creates the port's CQs (the receive CQ sized for the SRQ, the send CQ
  /// for a send window on each of `max_connections` connections), SRQ and
  /// send-block registration, and watches its completion channel in
  /// `epoll_fd` with `tags`. A receive's wr_id is its pool buffer's index,
  /// a send's its slot in the connection's in-flight ring. Receives go to
  /// `frames`, completed sends to `connections`.
  static Result<std::unique_ptr<RdmaPort>> create(Device& device, WorkerContext& ctx,
                                                  Connections& connections, FrameHandler& frames,
                                                  const SendBlocks& blocks, std::uint32_t max_connections,
                                                  int epoll_fd, EpollTags tags);
  /// SRQ first (returning the buffers still posted on it), then the CQ and channel.
  ~RdmaPort() override;
  RdmaPort(const RdmaPort&) = delete;
  RdmaPort& operator=(const RdmaPort&) = delete;

  // ---- Port
  /// Drains both CQs; true if it found any completion.
  bool poll() override;
  /// The periodic work (on_timers), then a refill.
  void after_flush() override;
  void check_deadlines(bool) override {}
  /// Requests an event for the next receive, and for the next send
  /// completion if `sends_awaited` (Connections::sends_awaited).
  void arm(bool sends_awaited) override;
  /// The completion channel woke the loop: takes its events (acked in batches).
  void on_event(std::uint64_t, std::uint32_t, bool) override { take_channel_events(); }
  PortEvent kind_of(std::uint64_t) const override { return PortEvent::kCompletion; }
  bool ready_in_spin(std::uint64_t) override {
    take_channel_events();  // left from before the spin, which polls the CQs anyway
    return false;
  }
  /// Drains the send CQ only.
  bool reap_sends() override;
  bool wants_events_every_turn() const override { return false; }
  bool seen_only_by_epoll() const override { return false; }
  bool accepting() const override { return false; }  // the listener and the CM events accept
  bool evict_accepting(std::uint64_t) override { return false; }
  void stop_accepting() override {}

  /// Posts receives up to srq_target() once it is a quarter of srq_depth
  /// short, or sooner if fewer are posted than the windows plus `to_grant`.
  void refill(Connections& connections, std::uint32_t to_grant = 0);
  /// The device found fewer than a refill batch of receives on the SRQ
  /// (IBV_EVENT_SRQ_LIMIT_REACHED, on the listener's async fd): counted and
  /// logged; the next refill that leaves more than a batch posted arms the
  /// limit again (the device disarms it when it fires).
  void on_srq_limit();
  /// Each loop turn: the port's periodic work, each on its own interval:
  /// rebalance (kRebalanceInterval) and check_idle_qps (kQpCheckInterval).
  void on_timers(Connections& connections, std::chrono::steady_clock::time_point now);

  /// A version-3 connection's window never shrinks below this (its CONNECT and one more frame).
  static constexpr std::uint32_t kMinWindow = 2;
  /// The fewest receives an SRQ keeps posted (buffers.srq_depth is cut to
  /// its share of half the pool, not below this).
  static constexpr std::uint32_t kMinSrqDepth = 4;
  /// Without data this long, a version-3 connection is asked to give back all but kMinWindow.
  static constexpr std::chrono::milliseconds kIdleReclaim{1000};
  /// How often idle connections' QPs are checked for the error state.
  static constexpr std::chrono::milliseconds kQpCheckInterval{1000};
  /// How often publishers are counted and idle connections' credits reclaimed.
  static constexpr std::chrono::milliseconds kRebalanceInterval{100};
  /// Windows may still grow by this much on this port.
  std::uint32_t capacity_free() const { return srq_max_ > windows_total ? srq_max_ - windows_total : 0; }
  /// The largest window a publishing connection may hold now: flow.credits,
  /// or less while so many publish that their windows would not fit srq_max.
  std::uint32_t fair_window(std::uint32_t configured) const;
  /// Receives to keep posted: the windows plus a refill batch, at least srq_depth.
  std::uint32_t srq_target() const;
  std::uint32_t srq_max() const { return srq_max_; }

  /// Receives that no client has a credit for: what may still be granted.
  std::uint32_t credit_budget() const { return posted_ > outstanding ? posted_ - outstanding : 0; }
  /// Room on the send CQ for another connection's send window.
  bool cq_has_room(std::uint32_t window) const { return cq_reserved + window <= cq_capacity; }

  /// How many pool buffers one RDMA READ may fill here (the device's
  /// scatter limit for READs and a send's); 0: the device cannot READ.
  std::uint32_t read_width() const { return read_width_; }
  /// Connection `id`'s rendezvous waits (buffers, a stall): after the next
  /// flush the frame handler reads on.
  void read_later(std::uint64_t id) { read_waiting_.push_back(id); }

  Device& device;
  std::uint32_t max_sge = 1;
  std::uint32_t outstanding = 0;    // credits granted to this port's clients, not yet used
  std::uint32_t windows_total = 0;  // the windows of this port's connections (RdmaLink::charged_)
  bool budget_short = false;        // a link had owed credits the budget could not cover
  /// Send CQ entries, and those spoken for: a send window
  /// (max_inflight_sends + 1) per connection. A connection that would
  /// overrun the CQ is refused: an overrun CQ breaks every QP on it.
  std::uint32_t cq_capacity = 0;
  std::uint32_t cq_reserved = 0;
  std::unordered_map<std::uint32_t, Connection*> by_qp;  // this port's connections by QP number
  std::uint32_t wc_faults_armed = 0;                     // test builds: links with fail_next_wc
  /// The chain of sends one link's flush builds (reused; reserved for a
  /// whole send window, so that WR pointers stay put while chaining).
  struct StagedSend {
    ibv_send_wr wr{};
    std::array<ibv_sge, kMaxSendSge> sge{};
    std::uint32_t frames = 0;
  };
  std::vector<StagedSend> staged;

  ibv_cq* recv_cq() const { return recv_cq_.get(); }
  ibv_cq* send_cq() const { return send_cq_.get(); }
  ibv_srq* srq() const { return srq_.get(); }
  std::uint32_t send_blocks_lkey() const { return send_blocks_mr_->lkey; }

 private:
  RdmaPort(Device& device, WorkerContext& ctx, Connections& connections, FrameHandler& frames)
      : device(device), ctx_(ctx), connections_(connections), frames_(frames) {}
  void take_channel_events();
  /// Retires the in-flight ring's head; a READ that succeeded hands its buffers to the frame handler.
  void retire(Connections& connections, Connection& c, bool success);
  /// srq_depth_, batch_ and srq_max_ from the options, the device and this
  /// port's share of the pool; why not, if the pool is too small.
  Status size_receive_queue();
  /// The completion channel and both CQs (the send CQ of `send_cqe`
  /// entries, at least one send `window`), cut to what the device grants.
  Status create_cqs(std::uint64_t send_cqe, std::uint32_t window);
  /// Counts the connections that publish (their fair share) and asks those
  /// idle for kIdleReclaim to give credits back.
  void rebalance(Connections& connections, std::chrono::steady_clock::time_point now);
  /// Closes (qp_fatal) idle connections whose QP is in the error state (RdmaLink::qp_in_error).
  void check_idle_qps(Connections& connections, std::chrono::steady_clock::time_point now);
  void on_receive(Connections& connections, FrameHandler& frames, const ibv_wc& wc);
  void on_send_complete(Connections& connections, const ibv_wc& wc);
  /// Takes every completion on `cq` (`receives`: the receive CQ); true if any.
  template <typename OnCompletion>
  bool drain(ibv_cq* cq, bool receives, OnCompletion&& on_completion);
  /// Test builds: turns a completion of a link with fail_next_wc into an error.
  void inject_wc_fault(ibv_wc& wc, bool receive);
  RdmaLink* link_of(std::uint32_t qp_num, Connection** c);
  /// Posts receives for refill(); returns what it posted.
  std::size_t post_receives(std::uint32_t want);
  /// Asks the device for IBV_EVENT_SRQ_LIMIT_REACHED below batch_ receives.
  void arm_limit();

  WorkerContext& ctx_;
  Connections& connections_;
  FrameHandler& frames_;
  std::uint32_t read_width_ = 0;
  std::vector<std::uint64_t> read_waiting_;  // read_later()
  verbs::CompChannelPtr channel_;            // members in creation order; reverse is a valid teardown
  verbs::CqPtr recv_cq_;
  verbs::CqEventAcker recv_acker_;  // acks before the CQ is destroyed
  verbs::CqPtr send_cq_;
  verbs::CqEventAcker send_acker_;
  verbs::SrqPtr srq_;
  verbs::MrPtr send_blocks_mr_;   // the worker's send blocks registered on this device
  std::uint32_t srq_depth_ = 0;   // receives always kept posted (buffers.srq_depth)
  std::uint32_t srq_max_ = 0;     // the bound of windows_total; the SRQ holds srq_max_ + batch_
  std::uint32_t batch_ = 1;       // receives per refill (srq_depth / 4)
  std::uint32_t posted_ = 0;      // receives on the SRQ
  std::uint32_t publishers_ = 0;  // connections with data in the last kIdleReclaim (rebalance)
  std::chrono::steady_clock::time_point next_rebalance_{};
  std::chrono::steady_clock::time_point next_qp_check_{};
  bool recv_armed_ = false;
  // The SRQ limit: a safety net, since credits never let senders use more
  // receives than are posted; it fires when the worker falls behind them or
  // the pool cannot refill. Off on a device that refuses it.
  bool limit_usable_ = true;
  bool limit_armed_ = false;
  bool send_armed_ = false;
  std::vector<std::uint8_t> posted_flag_;  // by pool index: buffers sitting on this SRQ
};

}  // namespace rdmabroker::daemon
