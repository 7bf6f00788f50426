// SPDX-License-Identifier: Apache-2.0
#include "rdma/rdma_dialer.hpp"

#include <netdb.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "rdma/rdma_link.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

namespace {

constexpr int kResolveTimeoutMs = 2000;

std::string cm_error(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

}  // namespace

void RdmaDialer::dial(std::uint64_t id, std::uint32_t slot, const ParsedUrl& url, RouteDial dial) {
  Pending p;
  p.id = id;
  p.slot = slot;
  p.peer = url.host + ":" + std::to_string(url.port);
  p.dial = std::move(dial);
  p.deadline = ctx_.now + kDialTimeout;
  auto [it, fresh] = pending_.emplace(id, std::move(p));
  // The name is resolved here, on the worker: a route is dialed rarely, and
  // an address (what cluster.routes usually holds) resolves without a lookup.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (const int rc = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return fail(it, "cannot resolve '" + url.host + "': " + gai_strerror(rc));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(channel_, &raw, reinterpret_cast<void*>(static_cast<std::uintptr_t>(id)), RDMA_PS_TCP) !=
      0) {
    freeaddrinfo(found);
    return fail(it, cm_error("rdma_create_id"));
  }
  it->second.cm_id.reset(raw);
  const int rc = rdma_resolve_addr(raw, nullptr, found->ai_addr, kResolveTimeoutMs);
  freeaddrinfo(found);
  if (rc != 0) return fail(it, cm_error("rdma_resolve_addr"));
}

bool RdmaDialer::on_cm_event(rdma_cm_event* ev) {
  const auto id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ev->id->context));
  auto it = pending_.find(id);
  if (it == pending_.end() || ev->id != it->second.cm_id.get()) return false;
  // What the event carries is copied before the ack (rdma_destroy_id waits for acks).
  const rdma_cm_event_type type = ev->event;
  const int status = ev->status;
  // Only a connection's answer carries private data (param is a union).
  std::vector<std::byte> private_data;
  if ((type == RDMA_CM_EVENT_CONNECT_RESPONSE || type == RDMA_CM_EVENT_REJECTED) &&
      ev->param.conn.private_data != nullptr) {
    const auto* data = static_cast<const std::byte*>(ev->param.conn.private_data);
    private_data.assign(data, data + ev->param.conn.private_data_len);
  }
  rdma_ack_cm_event(ev);
  Pending& p = it->second;
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(p.cm_id.get(), kResolveTimeoutMs) != 0) fail(it, cm_error("rdma_resolve_route"));
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      if (auto st = connect(p); !st) fail(it, st.error().message);
      break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (auto st = establish(it, private_data); !st) fail(it, st.error().message);
      break;
    case RDMA_CM_EVENT_REJECTED: {
      proto::ConnectReject reject;
      if (proto::decode(private_data, reject) == proto::HandshakeStatus::kOk) {
        fail(it, "refused the connection: " + std::string(proto::to_string(reject.reason)));
      } else {
        fail(it, "rejected (status " + std::to_string(status) + "; no rdmabroker there?)");
      }
      break;
    }
    default:
      fail(it, std::string(rdma_event_str(type)) + " (status " + std::to_string(status) + ")");
      break;
  }
  return true;
}

Status RdmaDialer::connect(Pending& p) {
  rdma_cm_id* id = p.cm_id.get();
  for (RdmaPort* port : ports_)
    if (port->device.context == id->verbs) p.port = port;
  if (p.port == nullptr) return Error{ErrorKind::kResource, "no port of this broker on the route's device"};
  RdmaPort& port = *p.port;
  const std::uint32_t window = ctx_.options.max_inflight_sends + 1;
  if (!port.cq_has_room(window))
    return Error{ErrorKind::kResource, "the completion queue on " + port.device.name + " is full"};
  // The broker at the other end sends what our subscriptions there bring:
  // a full window (flow.credits), backed by receives posted now.
  port.refill(connections_, ctx_.options.credits);
  p.grant = std::min({ctx_.options.credits, port.capacity_free(), port.credit_budget()});
  if (p.grant < proto::kMinCreditsByDemandWindow)
    return Error{ErrorKind::kResource, "no receive credits left on " + port.device.name};
  auto qp = RdmaLink::create_qp(port, p.id, window, p.max_inline);
  if (!qp) return qp.error();
  p.qp = std::move(qp.value());
  if (auto st = move_qp(id, p.qp.get(), {IBV_QPS_INIT}, false); !st) return st.error();
  port.outstanding += p.grant;  // the broker may send as soon as it accepts
  const auto request =
      proto::encode(proto::ConnectRequest{ctx_.options.buffer_size, p.grant, 0, proto::kProtocolVersion});
  rdma_conn_param param{};
  param.private_data = request.data();
  param.private_data_len = static_cast<std::uint8_t>(request.size());
  param.qp_num = p.qp->qp_num;
  param.srq = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // the broker keeps its QP's at 3 (SPEC.md §5)
  if (rdma_connect(id, &param) != 0) return Error{ErrorKind::kConnectFailed, cm_error("rdma_connect")};
  return {};
}

Status RdmaDialer::establish(Map::iterator it, std::span<const std::byte> accept_data) {
  Pending& p = it->second;
  proto::ConnectAccept accept;
  if (const auto st = proto::decode(accept_data, accept); st != proto::HandshakeStatus::kOk)
    return Error{ErrorKind::kConnectFailed, "a bad accept: " + std::string(proto::to_string(st))};
  if (auto st = move_qp(p.cm_id.get(), p.qp.get(), {IBV_QPS_RTR, IBV_QPS_RTS}, false); !st) return st.error();
  if (rdma_establish(p.cm_id.get()) != 0) return Error{ErrorKind::kConnectFailed, cm_error("rdma_establish")};
  RdmaPort& port = *p.port;
  const std::uint32_t qp_num = p.qp->qp_num;
  auto link = RdmaLink::dialed(port, ctx_, connections_, std::move(p.cm_id), std::move(p.qp), p.max_inline,
                               std::exchange(p.grant, 0), accept.initial_credits);
  auto conn = std::make_unique<Connection>(p.id, p.slot, p.peer, std::move(link), accept.max_frame_size,
                                           ctx_.options.max_inflight_sends, ConnState::kAccepting);
  conn->protocol_version = accept.version;
  conn->dialed = std::make_unique<DialedRoute>(std::move(p.dial));
  port.by_qp[qp_num] = conn.get();
  pending_.erase(it);
  Connection& c = connections_.add(std::move(conn));
  connections_.establish(c);
  frames_.dialed_up(c);
  return {};
}

void RdmaDialer::fail(Map::iterator it, const std::string& why) {
  const std::uint64_t route = it->second.dial.route;
  drop(it);
  if (ctx_.core.routes != nullptr) ctx_.core.routes->route_down(route, RouteEnd::kLost, "rdma: " + why);
}

void RdmaDialer::check_deadlines() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    if (ctx_.now >= it->second.deadline)
      fail(it, "no answer within " + std::to_string(kDialTimeout.count()) + " s");
    it = next;
  }
}

void RdmaDialer::cancel(std::uint64_t route) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->second.dial.route == route) {
      drop(it);
      return;
    }
  }
}

void RdmaDialer::cancel_all() {
  for (auto it = pending_.begin(); it != pending_.end();) it = drop(it);
}

RdmaDialer::Map::iterator RdmaDialer::drop(Map::iterator it) {
  Pending& p = it->second;
  if (p.port != nullptr) p.port->outstanding -= std::min(p.port->outstanding, p.grant);
  ctx_.core.admission->release(p.slot);
  return pending_.erase(it);  // the QP, then the cm_id
}

}  // namespace rdmabroker::daemon
