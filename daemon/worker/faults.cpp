// The worker's side of fault injection (fault/fault.hpp). Compiled in every
// build so that it keeps compiling, but reached only when fault::kEnabled:
// in the packaged broker the callers are discarded by `if constexpr`.
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "worker/worker.hpp"

namespace rdmabroker::daemon {
namespace {

/// Moves a QP to the error state, as a device does after a failed work request.
bool force_error(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0;
}

}  // namespace

void Worker::on_fault(FaultCommand& f) {
  Status result;
  Connection* c = find(f.spec.connection);
  if (c == nullptr) {
    result = Error{ErrorKind::kInvalidArgument,
                   "no connection " + std::to_string(f.spec.connection) + " on this broker"};
  } else if (c->transport != Transport::kRdma) {
    result = Error{ErrorKind::kInvalidArgument,
                   "connection " + std::to_string(c->id) + " is not an RDMA connection"};
  } else if (c->state != ConnState::kEstablished) {
    result = Error{ErrorKind::kInvalidArgument,
                   "connection " + std::to_string(c->id) + " is " + std::string(to_string(c->state))};
  } else if (f.spec.kind == fault::Kind::kWcError) {
    if (!c->fail_next_wc) {
      c->fail_next_wc = true;
      ++wc_faults_armed_;
    }
    spdlog::warn("fault: the next completion of connection {} will fail", c->id);
  } else if (f.spec.kind == fault::Kind::kQpError) {
    if (!force_error(c->qp.get())) {
      result = Error{ErrorKind::kResource, std::string("ibv_modify_qp(ERR): ") + std::strerror(errno)};
    } else {
      spdlog::warn("fault: connection {}'s QP forced into the error state", c->id);
    }
  } else {
    result = Error{ErrorKind::kInvalidArgument, "not a fault of a connection"};
  }
  f.reply->set_value(std::move(result));
}

void Worker::inject_wc_fault(ibv_wc& wc, DevicePort& port) {
  auto it = port.by_qp.find(wc.qp_num);
  if (it == port.by_qp.end() || !it->second->fail_next_wc) return;
  Connection& c = *it->second;
  c.fail_next_wc = false;
  --wc_faults_armed_;
  // A failed work request leaves its QP in the error state; everything still
  // posted then completes as flushed. The completion itself reads as a
  // device error of its direction.
  wc.status = (wc.wr_id & kRecvFlag) != 0 ? IBV_WC_LOC_PROT_ERR : IBV_WC_REM_ACCESS_ERR;
  force_error(c.qp.get());
  spdlog::warn("fault: a completion of connection {} reported as {}", c.id, ibv_wc_status_str(wc.status));
}

void Worker::deliver_delayed_cm_events() {
  std::vector<DelayedCmEvent> due;
  std::erase_if(delayed_cm_, [&](const DelayedCmEvent& e) {
    if (e.due > now_) return false;
    due.push_back(e);
    return true;
  });
  for (const auto& e : due) {
    spdlog::info("fault: {} of connection {} handled now, late", rdma_event_str(e.type), e.conn_id);
    on_cm_event(e.type, e.status, e.conn_id);
  }
}

}  // namespace rdmabroker::daemon
