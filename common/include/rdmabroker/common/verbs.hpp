// SPDX-License-Identifier: Apache-2.0
// RAII owners for every verbs and rdma_cm handle. Each alias frees its handle
// with the matching destroy call; a struct that owns several declares them in
// creation order so that reverse-order destruction is a valid teardown
// (QP and AH before CQ/SRQ, MR before PD, the cm_id last).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <memory>

namespace rdmabroker::verbs {

/// Inline data asked for on every RC QP, broker and client: a small message
/// with its headers fits. The device may grant less, or refuse any (then the
/// QP is created without); what it granted is in the QP's init attributes.
inline constexpr std::uint32_t kInlineWanted = 256;

struct PdDeleter {
  void operator()(ibv_pd* p) const noexcept { ibv_dealloc_pd(p); }
};
struct CqDeleter {
  void operator()(ibv_cq* p) const noexcept { ibv_destroy_cq(p); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* p) const noexcept { ibv_destroy_comp_channel(p); }
};
struct SrqDeleter {
  void operator()(ibv_srq* p) const noexcept { ibv_destroy_srq(p); }
};
struct MrDeleter {
  void operator()(ibv_mr* p) const noexcept { ibv_dereg_mr(p); }
};
struct QpDeleter {
  void operator()(ibv_qp* p) const noexcept { ibv_destroy_qp(p); }
};
struct AhDeleter {
  void operator()(ibv_ah* p) const noexcept { ibv_destroy_ah(p); }
};
struct EventChannelDeleter {
  void operator()(rdma_event_channel* p) const noexcept { rdma_destroy_event_channel(p); }
};
struct CmIdDeleter {
  void operator()(rdma_cm_id* p) const noexcept { rdma_destroy_id(p); }
};
struct DeviceListDeleter {
  void operator()(ibv_context** p) const noexcept { rdma_free_devices(p); }
};

using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using SrqPtr = std::unique_ptr<ibv_srq, SrqDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;
/// A QP created with ibv_create_qp and moved through its states by its
/// owner (rdma_cm then never touches it: the broker's accepted QPs).
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;

/// How rdmabroker registers memory (docs/security.md): for local access by
/// the NIC (receives land in it, sends gather from it), never for remote
/// read or write, so no peer can reach it with an rkey. Null on failure,
/// errno set. tests/lint.sh fails if ibv_reg_mr appears elsewhere.
inline MrPtr register_local(ibv_pd* pd, void* addr, std::size_t length) {
  return MrPtr(ibv_reg_mr(pd, addr, length, IBV_ACCESS_LOCAL_WRITE));
}
/// The exceptions, a client's only (tests/lint.sh keeps them out of the
/// broker): a message the client offers by rendezvous (SPEC.md §3.8),
/// registered on its own for the broker to READ, and deregistered when the
/// broker releases it. Nothing else of the client's is ever exposed.
inline MrPtr register_offered_message(ibv_pd* pd, void* addr, std::size_t length) {
  return MrPtr(ibv_reg_mr(pd, addr, length, IBV_ACCESS_REMOTE_READ));
}
/// And a client's landing area (SPEC.md §3.9): the memory of one large
/// message it receives, registered for the broker to WRITE the message into
/// and deregistered once the message is whole.
inline MrPtr register_landing_area(ibv_pd* pd, void* addr, std::size_t length) {
  return MrPtr(ibv_reg_mr(pd, addr, length, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
}
/// The QP that carries offers lets its broker READ and, with `write`, WRITE
/// (an rkey is still needed: only an offered message's or a landing area's
/// opens anything). False (errno set) on failure.
inline bool allow_remote_access(ibv_qp* qp, bool write) {
  ibv_qp_attr attr{};
  attr.qp_access_flags = write ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
  return ibv_modify_qp(qp, &attr, IBV_QP_ACCESS_FLAGS) == 0;
}
/// Posts one receive of [addr, addr+length) in memory registered with `lkey`;
/// false (errno set) if the QP refused it.
inline bool post_receive(ibv_qp* qp, void* addr, std::uint32_t length, std::uint32_t lkey,
                         std::uint64_t wr_id) {
  ibv_sge sge{reinterpret_cast<std::uint64_t>(addr), length, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad) == 0;
}
using AhPtr = std::unique_ptr<ibv_ah, AhDeleter>;
using EventChannelPtr = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;
using CmIdPtr = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
using DeviceListPtr = std::unique_ptr<ibv_context*, DeviceListDeleter>;

/// A QP created through rdma_create_qp belongs to its cm_id: it is destroyed
/// with rdma_destroy_qp, which clears id->qp. Holds the id, not the QP, so the
/// owner keeps one pointer for both and destroys the QP before the id.
class CmQp {
 public:
  CmQp() = default;
  explicit CmQp(rdma_cm_id* id) : id_(id) {}
  CmQp(CmQp&& o) noexcept : id_(o.id_) { o.id_ = nullptr; }
  CmQp& operator=(CmQp&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = nullptr;
    }
    return *this;
  }
  CmQp(const CmQp&) = delete;
  CmQp& operator=(const CmQp&) = delete;
  ~CmQp() { reset(); }

  void reset() noexcept {
    if (id_ != nullptr && id_->qp != nullptr) rdma_destroy_qp(id_);
    id_ = nullptr;
  }
  ibv_qp* get() const { return id_ != nullptr ? id_->qp : nullptr; }
  explicit operator bool() const { return get() != nullptr; }

 private:
  rdma_cm_id* id_ = nullptr;
};

/// An rdma_cm event that is acknowledged when this owner goes away.
struct CmEventDeleter {
  void operator()(rdma_cm_event* e) const noexcept { rdma_ack_cm_event(e); }
};
using CmEventPtr = std::unique_ptr<rdma_cm_event, CmEventDeleter>;

/// Acknowledges CQ events in batches (ibv_ack_cq_events takes a mutex; per-event
/// acks are measurable) and always before the CQ is destroyed.
class CqEventAcker {
 public:
  explicit CqEventAcker(ibv_cq* cq = nullptr) : cq_(cq) {}
  CqEventAcker(const CqEventAcker&) = delete;
  CqEventAcker& operator=(const CqEventAcker&) = delete;
  ~CqEventAcker() { flush(); }
  void attach(ibv_cq* cq) {
    flush();
    cq_ = cq;
  }
  void add() {
    if (++pending_ >= 64) flush();
  }
  void flush() noexcept {
    if (cq_ != nullptr && pending_ != 0) ibv_ack_cq_events(cq_, pending_);
    pending_ = 0;
  }

 private:
  ibv_cq* cq_;
  unsigned pending_ = 0;
};

}  // namespace rdmabroker::verbs
