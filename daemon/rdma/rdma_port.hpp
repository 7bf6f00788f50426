// A worker's resources on one RDMA device: a completion channel, a CQ shared
// by every QP of the worker on that device, an SRQ fed from the broker's
// pool, and the worker's send blocks registered there. The port drains its
// CQ (receives go to the frame handler, send completions retire the
// connection's in-flight sends) and refills its SRQ at a low watermark.
// Owned by the worker, used only on its thread.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "rdma/device.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class FrameHandler;
class RdmaLink;

class RdmaPort {
 public:
  /// Receives carry this bit in their wr_id (the opcode of an error
  /// completion is undefined): the rest is the pool buffer's index.
  static constexpr std::uint64_t kRecvFlag = 1ull << 63;

  /// Creates the port's CQ (sized for the SRQ plus a send window on each of
  /// `max_connections` connections), SRQ and send-block registration.
  static Result<std::unique_ptr<RdmaPort>> create(Device& device, WorkerContext& ctx,
                                                  const SendBlocks& blocks, std::uint32_t max_connections);
  /// SRQ first (returning the buffers still posted on it), then the CQ and channel.
  ~RdmaPort();
  RdmaPort(const RdmaPort&) = delete;
  RdmaPort& operator=(const RdmaPort&) = delete;

  int channel_fd() const { return channel_->fd; }
  /// Drains the CQ; true if it found any completion.
  bool poll(Connections& connections, FrameHandler& frames);
  /// Requests an event for the next completion (before the loop sleeps).
  void arm();
  /// The completion channel woke the loop: takes its events (acked in batches).
  void take_channel_events();
  /// Posts receives up to the SRQ depth once it is below three quarters of it.
  void refill(Connections& connections);

  /// Receives that no client has a credit for: what may still be granted.
  std::uint32_t credit_budget() const { return posted_ > outstanding ? posted_ - outstanding : 0; }
  /// Room on the CQ for another connection's send window.
  bool cq_has_room(std::uint32_t window) const { return cq_reserved + window <= cq_capacity; }

  Device& device;
  std::uint32_t max_sge = 1;
  std::uint32_t outstanding = 0;  // credits granted to this port's clients, not yet used
  /// CQ entries, and those spoken for: the SRQ's receives plus a send window
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

  ibv_cq* cq() const { return cq_.get(); }
  ibv_srq* srq() const { return srq_.get(); }
  std::uint32_t send_blocks_lkey() const { return send_blocks_mr_->lkey; }

 private:
  RdmaPort(Device& device, WorkerContext& ctx) : device(device), ctx_(ctx) {}
  void on_receive(Connections& connections, FrameHandler& frames, const ibv_wc& wc);
  void on_send_complete(Connections& connections, const ibv_wc& wc);
  /// Test builds: turns a completion of a link with fail_next_wc into an error.
  void inject_wc_fault(ibv_wc& wc);
  RdmaLink* link_of(std::uint32_t qp_num, Connection** c);

  WorkerContext& ctx_;
  verbs::CompChannelPtr channel_;  // members in creation order; reverse is a valid teardown
  verbs::CqPtr cq_;
  verbs::CqEventAcker acker_;  // acks before the CQ is destroyed
  verbs::SrqPtr srq_;
  verbs::MrPtr send_blocks_mr_;  // the worker's send blocks registered on this device
  std::uint32_t srq_depth_ = 0;
  std::uint32_t posted_ = 0;  // receives on the SRQ
  bool armed_ = false;
  std::vector<std::uint8_t> posted_flag_;  // by pool index: buffers sitting on this SRQ
};

}  // namespace rdmabroker::daemon
