// SPDX-License-Identifier: Apache-2.0
// RdmaTransport: sending. SENDs are posted from the thread that has
// something to send, or handed to the I/O thread when posts come faster
// than one takes (hand_off_locked); each needs a credit and a send slot,
// and completions are reaped under the session's lock (rdma_transport.hpp).
#include <thread>

#include "rdma_transport.hpp"

namespace rdmabroker {

void RdmaTransport::transmit_locked() {
  if (session_.closed_locked()) return;
  const bool app_thread = io_thread_.joinable() && std::this_thread::get_id() != io_thread_.get_id();
  if (app_thread && hand_off_locked()) return;
  handed_off_ = false;
  const auto started = app_thread ? Clock::now() : Clock::time_point{};
  const std::uint64_t posts_before = next_wr_;
  reap_sends_locked();
  post_ready_locked();
  if (app_thread && next_wr_ != posts_before) {
    last_post_end_ = Clock::now();
    last_post_cost_ = (last_post_end_ - started) / static_cast<int>(next_wr_ - posts_before);
  }
  arm_sends_if_waited_locked();
}

bool RdmaTransport::hand_off_locked() {
  const auto now = Clock::now();
  // The I/O thread posts it with what gathered meanwhile; unless it has not
  // come round to it for a millisecond (a handler of this client's that
  // takes its time does not hold up its publishers).
  if (handed_off_) return now - handed_off_at_ < std::chrono::milliseconds(1);
  if (now - last_post_end_ >= last_post_cost_) return false;
  handed_off_ = true;
  handed_off_at_ = now;
  wake();
  return true;
}

void RdmaTransport::post_ready_locked() {
  while (inflight_.size() < session_.options().max_inflight_sends) {
    if (!session_.has_ready_locked() || !credits_.can_send_data()) {
      // No data, or no credit for it: owed credits may still have to go back,
      // using the reserved last credit if need be.
      // A broker asking for credits back (SPEC.md §5.1) gets them the same way.
      if ((credits_.should_return() || credits_.wants_release()) && credits_.can_send_credit_update())
        post_locked(SessionSide::kNoBuffer, 0);
      break;
    }
    // Idle enough to post the buffer being filled right away: batching only
    // happens while sends are in flight, so it adds no latency at light load.
    const auto [buf, len] = session_.take_ready_locked();
    if (!post_locked(buf, len)) return;
  }
}

void RdmaTransport::reclaim_locked() {
  if (session_.closed_locked()) return;
  reap_sends_locked();
  arm_sends_if_waited_locked();
}

bool RdmaTransport::send_events_wanted_locked() const {
  // Someone waits for a SEND to complete: the I/O thread, to post buffers
  // or owed credits that the full window holds back; a publisher, for a
  // free buffer; close(), for everything to leave. Nobody else needs to
  // hear of one. The owed credits matter when nothing else will come: a
  // broker that spent its last credit on credit updates can send nothing
  // (not even a flush's PONG) until they go back, so without this event a
  // client with one send slot, caught by those updates while a long SEND
  // was in flight, waited for ever.
  if (inflight_.empty()) return false;
  if (session_.closing_locked() || session_.out_of_buffers_locked()) return true;
  return inflight_.size() >= session_.options().max_inflight_sends &&
         (session_.has_ready_locked() || credits_.should_return() || credits_.wants_release());
}

void RdmaTransport::arm_sends_if_waited_locked() {
  while (!send_cq_armed_ && send_events_wanted_locked()) {
    ibv_req_notify_cq(send_cq_.get(), 0);
    send_cq_armed_ = true;
    // A completion between the last poll and the arming raises no event.
    if (reap_sends_locked()) transmit_locked();
  }
}

bool RdmaTransport::reap_sends_locked() {
  ibv_wc wcs[16];
  bool any = false;
  int got;
  while ((got = ibv_poll_cq(send_cq_.get(), 16, wcs)) > 0) {
    any = true;
    for (int i = 0; i < got; ++i) {
      const ibv_wc& wc = wcs[i];
      // This SEND and every one before it are done (an RC send queue
      // completes in order; wr_id numbers the posts).
      while (!inflight_.empty() && inflight_.front().wr <= wc.wr_id) {
        session_.release_send_buffer_locked(inflight_.front().buffer);
        inflight_.pop_front();
      }
      if (wc.status != IBV_WC_SUCCESS && !session_.closed_locked()) {
        const Error e{ErrorKind::kClosed, std::string("send failed: ") + ibv_wc_status_str(wc.status)};
        if (wc.status != IBV_WC_WR_FLUSH_ERR) {
          send_errors_.push_back(e);
          wake();
        }
        session_.fail_locked(e);
      }
    }
  }
  if (any) session_.sends_completed_locked();  // close() waits for the last SEND, inline or not
  return any;
}

bool RdmaTransport::post_locked(std::uint32_t buffer, std::uint32_t len) {
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.wr_id = next_wr_;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  const std::uint32_t returned = credits_.take_owed(proto::kMaxCreditsPerImm);
  wr.imm_data = htonl(by_demand() ? proto::encode_credit_imm({returned, credits_.take_release()}) : returned);
  wr.send_flags = IBV_SEND_SIGNALED;  // into the quiet send CQ: it wakes nobody
  // A small send (a lone publish at light load) is copied by the device at
  // post time instead of read by DMA afterwards: its buffer is free at once.
  const bool inline_copy = buffer != SessionSide::kNoBuffer && len <= max_inline_;
  if (buffer != SessionSide::kNoBuffer) {
    sge = ibv_sge{reinterpret_cast<std::uint64_t>(session_.send_buffer(buffer)), len, send_mr_->lkey};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (inline_copy) wr.send_flags |= IBV_SEND_INLINE;
  }
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_.get(), &wr, &bad) != 0) {
    session_.fail_locked(sys_error(ErrorKind::kClosed, "ibv_post_send"));
    return false;
  }
  credits_.consume_send();
  if (inline_copy) {
    session_.release_send_buffer_locked(buffer);
    buffer = SessionSide::kNoBuffer;
  }
  inflight_.push_back(Posted{next_wr_++, buffer});
  return true;
}

}  // namespace rdmabroker
