// SPDX-License-Identifier: Apache-2.0
#include "rdma/rdma_link.hpp"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace rdmabroker::daemon {

void reject_connect_request(rdma_cm_id* id, proto::RejectReason reason, std::uint32_t buffer_size) {
  auto data = proto::encode(proto::ConnectReject{reason, buffer_size});
  rdma_reject(id, data.data(), static_cast<std::uint8_t>(data.size()));
}

RdmaLink::RdmaLink(RdmaPort& port, WorkerContext& ctx, Connections& connections, verbs::CmIdPtr id,
                   verbs::QpPtr qp, std::uint32_t max_inline)
    : port_(port),
      ctx_(ctx),
      connections_(connections),
      cm_id_(std::move(id)),
      qp_(std::move(qp)),
      qp_num_(qp_->qp_num),
      max_inline_(max_inline) {}

Result<std::uint8_t> move_qp(rdma_cm_id* id, ibv_qp* qp, std::initializer_list<ibv_qp_state> states,
                             bool clamp_rnr, std::uint8_t read_depth) {
  std::uint8_t asked = 0;
  for (const ibv_qp_state state : states) {
    ibv_qp_attr attr{};
    int mask = 0;
    attr.qp_state = state;
    if (rdma_init_qp_attr(id, &attr, &mask) != 0) {
      return Error{ErrorKind::kResource, std::string("rdma_init_qp_attr: ") + std::strerror(errno)};
    }
    switch (state) {
      case IBV_QPS_INIT:
        attr.qp_access_flags = 0;  // nothing of ours is remotely accessible
        break;
      case IBV_QPS_RTR:
        attr.max_dest_rd_atomic = 0;  // no responder resources: no peer READs from us
        break;
      default:
        attr.max_rd_atomic = read_depth;
        asked = attr.rnr_retry;
        if (clamp_rnr) attr.rnr_retry = std::min(attr.rnr_retry, RdmaLink::kMaxRnrRetry);
        break;
    }
    if (const int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) {
      return Error{ErrorKind::kResource, "ibv_modify_qp to " +
                                             std::string(state == IBV_QPS_INIT  ? "INIT"
                                                         : state == IBV_QPS_RTR ? "RTR"
                                                                                : "RTS") +
                                             ": " + std::strerror(rc)};
    }
  }
  return asked;
}

// QP before cm_id: the members' reverse order.
RdmaLink::~RdmaLink() = default;

Result<std::uint32_t> RdmaLink::claim_credits(RdmaPort& port, WorkerContext& ctx, Connections& connections,
                                              std::uint32_t window) {
  if (port.capacity_free() < RdmaPort::kMinWindow) {
    ctx.stats.credit_refusals.add();
    return Error{ErrorKind::kResource, "no receive credits left on " + port.device.name + " (" +
                                           std::to_string(port.windows_total) + " of " +
                                           std::to_string(port.srq_max()) + " granted)"};
  }
  if (port.credit_budget() < kUnauthenticatedCredits) port.refill(connections, kUnauthenticatedCredits);
  const std::uint32_t grant = std::min({ctx.options.credits, kUnauthenticatedCredits, port.credit_budget()});
  if (grant < 2) {
    return Error{ErrorKind::kResource,
                 "no receive buffers posted on " + port.device.name + " (the buffer pool is exhausted)"};
  }
  if (!port.cq_has_room(window)) {
    ctx.stats.cq_full.add();
    return Error{ErrorKind::kResource, "the completion queue on " + port.device.name + " is full (" +
                                           std::to_string(port.cq_capacity) + " entries)"};
  }
  return grant;
}

Result<verbs::QpPtr> RdmaLink::create_qp(RdmaPort& port, std::uint64_t connection_id, std::uint32_t window,
                                         std::uint32_t& max_inline) {
  ibv_qp_init_attr attr{};
  attr.qp_context = reinterpret_cast<void*>(static_cast<std::uintptr_t>(connection_id));
  attr.send_cq = port.send_cq();
  attr.recv_cq = port.recv_cq();
  attr.srq = port.srq();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = window;  // the send window + a credit update
  attr.cap.max_send_sge = port.max_sge;
  attr.cap.max_inline_data = verbs::kInlineWanted;
  // The QP is ours, not rdma_cm's (rdma_create_qp): rdma_accept would move
  // it to RTS with the RNR retry count the client asked for (move_qp).
  verbs::QpPtr qp(ibv_create_qp(port.device.pd.get(), &attr));
  if (!qp) {
    // A device that cannot inline (or not that much) still gets the QP.
    attr.cap.max_inline_data = 0;
    qp.reset(ibv_create_qp(port.device.pd.get(), &attr));
    if (!qp) return Error{ErrorKind::kResource, std::string("ibv_create_qp: ") + std::strerror(errno)};
  }
  max_inline = attr.cap.max_inline_data;
  return qp;
}

std::uint32_t RdmaLink::rendezvous_min_for(std::uint8_t version, const BrokerOptions& opt,
                                           const RdmaPort& port) {
  // Version 8 over RDMA: the client may offer large messages for us to READ
  // (SPEC.md §3.8), any larger than a frame (so that it goes as fragments).
  if (version < proto::kRendezvousVersion || opt.rendezvous_min == 0 || port.read_width() == 0) return 0;
  return std::max(opt.rendezvous_min, opt.buffer_size);
}

std::uint8_t RdmaLink::read_depth_on(const RdmaPort& port) {
  return static_cast<std::uint8_t>(
      std::min<int>(Connection::RendezvousRead::kMaxReads, port.device.attr.max_qp_init_rd_atom));
}

bool RdmaLink::send_accept(rdma_cm_id* id, const Connection& conn, std::uint32_t grant, std::uint32_t qp_num,
                           std::uint8_t read_depth, const BrokerOptions& opt) {
  auto data = proto::encode(proto::ConnectAccept{opt.buffer_size, grant, conn.id, conn.protocol_version,
                                                 opt.max_payload, conn.rendezvous_min});
  rdma_conn_param param{};
  // The client's QP answers our READs with as many responder resources.
  param.initiator_depth = read_depth;
  param.private_data = data.data();
  param.private_data_len = static_cast<std::uint8_t>(proto::accept_size(conn.protocol_version));
  param.rnr_retry_count = 7;  // the client's QP's: a safety net only, credits keep a receive posted
  param.qp_num = qp_num;      // a QP of our own (ready_qp) on an SRQ
  param.srq = 1;
  return rdma_accept(id, &param) == 0;
}

std::unique_ptr<Connection> RdmaLink::accept(AcceptCommand& cmd, RdmaPort& port, WorkerContext& ctx,
                                             Connections& connections, bool stopping) {
  verbs::CmIdPtr id = std::move(cmd.id);
  const auto& opt = ctx.options;
  auto fail = [&](proto::RejectReason reason, const std::string& why) -> std::unique_ptr<Connection> {
    log_throttled(ctx.core.rdma_accept_log, spdlog::level::warn, "connection {} from {} refused: {}",
                  cmd.connection_id, cmd.peer, why);
    ctx.stats.accept_failures.add();
    reject_connect_request(id.get(), reason, opt.buffer_size);
    ctx.core.admission->release(cmd.slot);
    return nullptr;
  };
  if (stopping) return fail(proto::RejectReason::kShuttingDown, "shutting down");
  // Every connection claims 2 credits of the port's SRQ here. A version-3
  // one grows by demand; an older one gets flow.credits at its login, or
  // what the port has left then (SPEC.md §5.1).
  const std::uint8_t version = Admission::version_for(Admission::Via::kRdma, cmd.request);
  const bool by_demand = version >= proto::kCreditsByDemandVersion;
  const std::uint32_t window = opt.max_inflight_sends + 1;
  const std::uint32_t rendezvous_min = rendezvous_min_for(version, opt, port);
  const std::uint8_t read_depth = rendezvous_min == 0 ? 0 : read_depth_on(port);
  const auto claimed = claim_credits(port, ctx, connections, window);
  if (!claimed) return fail(proto::RejectReason::kNoResources, claimed.error().message);
  const std::uint32_t grant = claimed.value();

  std::uint32_t max_inline = 0;
  auto qp = create_qp(port, cmd.connection_id, window, max_inline);
  if (!qp) return fail(proto::RejectReason::kNoResources, qp.error().message);
  // Through RTS at once, with the RNR retry count the client asked for cut
  // to kMaxRnrRetry, before rdma_accept (a QP of our own on an SRQ).
  auto ready =
      move_qp(id.get(), qp.value().get(), {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}, true, read_depth);
  if (!ready) return fail(proto::RejectReason::kNoResources, ready.error().message);
  if (*ready > kMaxRnrRetry) {
    spdlog::debug("connection {} from {}: RNR retry count {} asked for, {} kept", cmd.connection_id, cmd.peer,
                  *ready, kMaxRnrRetry);
  }
  rdma_cm_id* raw = id.get();
  const std::uint32_t qp_num = qp.value()->qp_num;
  std::unique_ptr<RdmaLink> link(
      new RdmaLink(port, ctx, connections, std::move(id), std::move(qp.value()), max_inline));
  link->credits = CreditWindow(grant);
  link->credits.grant_initial(grant);
  link->credits.add_send_credits(cmd.request.initial_credits);
  RdmaLink& l = *link;
  auto conn = std::make_unique<Connection>(cmd.connection_id, cmd.slot, std::move(cmd.peer), std::move(link),
                                           cmd.request.recv_buffer_size, opt.max_inflight_sends,
                                           ConnState::kAccepting);
  conn->protocol_version = version;
  conn->route_listener = cmd.route_listener;
  conn->rendezvous_min = read_depth > 0 ? rendezvous_min : 0;
  conn->answers_landings = (cmd.request.flags & proto::kConnectLanding) != 0 &&
                           version >= proto::kLandingVersion && conn->rendezvous_min != 0;
  l.read_depth_ = read_depth;
  l.by_demand_ = by_demand;
  l.last_data_ = ctx.now;
  // Datagrams carry PUBLISH frames as received, header blocks included, and
  // a member's sequenced DELIVERs are never cut: a group is only for clients
  // that can read them whole (SPEC.md §7).
  conn->multicast_capable = (cmd.request.flags & proto::kConnectMulticast) != 0 &&
                            conn->protocol_version >= proto::kHeadersVersion &&
                            cmd.request.recv_buffer_size >= opt.buffer_size;
  port.outstanding += grant;
  l.sync_charge();

  if (!send_accept(raw, *conn, grant, qp_num, read_depth, opt)) {
    log_throttled(ctx.core.rdma_accept_log, spdlog::level::warn, "connection {} from {}: rdma_accept: {}",
                  conn->id, conn->peer, std::strerror(errno));
    ctx.stats.accept_failures.add();
    port.outstanding -= l.credits.forfeit();
    l.charge(0);
    ctx.core.admission->release(cmd.slot);
    return nullptr;  // QP, then cm_id, destroyed with the link
  }
  port.cq_reserved += window;
  port.by_qp[l.qp_num_] = conn.get();
  return conn;
}

std::unique_ptr<RdmaLink> RdmaLink::dialed(RdmaPort& port, WorkerContext& ctx, Connections& connections,
                                           verbs::CmIdPtr id, verbs::QpPtr qp, std::uint32_t max_inline,
                                           std::uint32_t grant, std::uint32_t peer_credits) {
  std::unique_ptr<RdmaLink> link(
      new RdmaLink(port, ctx, connections, std::move(id), std::move(qp), max_inline));
  link->dialed_ = true;
  link->credits = CreditWindow(grant);
  link->credits.grant_initial(grant);
  link->credits.add_send_credits(peer_credits);
  link->last_data_ = ctx.now;
  link->sync_charge();
  port.cq_reserved += ctx.options.max_inflight_sends + 1;  // its send window, as an accepted one's
  return link;
}

void RdmaLink::on_authenticated() {
  Connection& c = connection();
  if (by_demand_) return;  // grows as it publishes (on_credit_imm)
  // An older client's whole window, as far as the port's receives allow.
  const std::uint32_t more =
      std::min(ctx_.options.credits > credits.window() ? ctx_.options.credits - credits.window() : 0,
               port_.capacity_free());
  if (more == 0) return;
  credits.grow(more);  // claims the SRQ's budget as they are handed out (take_imm)
  sync_charge();
  connections_.touch(c);
}

void RdmaLink::release() {
  Connection& c = connection();
  port_.outstanding -= std::min(port_.outstanding, credits.forfeit());
  charge(0);
  port_.cq_reserved -= static_cast<std::uint32_t>(c.inflight.size());  // its send window (accept)
  port_.by_qp.erase(qp_num_);
  if (fail_next_wc) --port_.wc_faults_armed;
}

void RdmaLink::disconnect() {
  Connection& c = connection();
  // rdma_cm puts only QPs of its own in the error state: ours goes now, so
  // that what is still posted completes as flushed.
  force_error();
  if (!c.peer_disconnected) rdma_disconnect(cm_id_.get());
}

std::string RdmaLink::where() const {
  return "on " + port_.device.name + " (qp " + std::to_string(qp_num_) + ")";
}

const sockaddr* RdmaLink::multicast_address(std::uint32_t& device) const {
  device = port_.device.index;
  return rdma_get_local_addr(cm_id_.get());
}

bool RdmaLink::force_error() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  return ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE) == 0;
}

Status RdmaLink::inject_fault(fault::Kind kind) {
  const auto id =
      reinterpret_cast<std::uintptr_t>(cm_id_->context);  // the connection's id, set by the listener
  if (kind == fault::Kind::kWcError) {
    if (!fail_next_wc) {
      fail_next_wc = true;
      ++port_.wc_faults_armed;
    }
    spdlog::warn("fault: the next completion of connection {} will fail", id);
    return {};
  }
  if (!force_error())
    return Error{ErrorKind::kResource, std::string("ibv_modify_qp(ERR): ") + std::strerror(errno)};
  spdlog::warn("fault: connection {}'s QP forced into the error state", id);
  return {};
}

void RdmaLink::charge(std::uint32_t amount) {
  port_.windows_total = port_.windows_total - charged_ + amount;
  ctx_.stats.credits_granted.add(static_cast<std::int64_t>(amount) - static_cast<std::int64_t>(charged_));
  charged_ = amount;
}

void RdmaLink::sync_charge() { charge(credits.window()); }

bool RdmaLink::on_credit_imm(std::uint32_t imm, bool data, bool publishes) {
  if (dialed_) {
    // A route this broker dialed is the client here: the broker's ask for
    // credits back (SPEC.md §5.1) may go unanswered, and it never asks
    // while the window is this small.
    credits.add_send_credits(split_imm_ ? proto::decode_credit_imm(imm).returned : imm);
    return true;
  }
  if (!by_demand_) {
    credits.add_send_credits(imm);
    return true;
  }
  const auto [returned, release] = proto::decode_credit_imm(imm);
  credits.add_send_credits(returned);
  if (release > 0) {
    if (!credits.on_release(release)) return false;
    port_.outstanding -= std::min(port_.outstanding, release - 1);
    // An ask overtaken by credits kept back could leave it under the minimum.
    credits.keep_at_least(RdmaPort::kMinWindow);
    asked_at_ = {};
    sync_charge();
  }
  if (!data) return true;
  last_data_ = ctx_.now;
  if (!publishes) return true;
  // Grow while the client uses more than half its window (doubling, as far
  // as the port's SRQ allows); above its fair share, keep one credit per
  // SEND until it is back there.
  const std::uint32_t cap = port_.fair_window(ctx_.options.credits);
  const std::uint32_t w = credits.window();
  if (w < cap && credits.outstanding() <= w / 2) {
    const std::uint32_t n = std::min({w, cap - w, port_.capacity_free()});
    if (n > 0) {
      credits.grow(n);
      sync_charge();
    }
  } else if (w > cap) {
    credits.withhold(1);
    sync_charge();
  }
  return true;
}

std::uint32_t RdmaLink::read_width() const { return read_depth_ == 0 ? 0 : port_.read_width(); }

void RdmaLink::resume() {
  if (connection().rendezvous.open) read_later();
}

void RdmaLink::read_later() { port_.read_later(connection().id); }

bool RdmaLink::read_remote(std::uint64_t address, std::uint32_t rkey, std::span<const Segment> pieces,
                           std::array<BufferRef, kMaxFramesPerSend>& blocks) {
  Connection& c = connection();
  if (read_depth_ == 0 || !c.can_send() || pieces.empty() || pieces.size() > kMaxFramesPerSend) return false;
  std::array<ibv_sge, kMaxFramesPerSend> sge{};
  for (std::size_t i = 0; i < pieces.size(); ++i)
    sge[i] = ibv_sge{pieces[i].addr, pieces[i].length, port_.device.pool_mr->lkey};
  const std::uint32_t slot = c.inflight_tail();
  PackedSend packed;
  packed.frames = static_cast<std::uint32_t>(pieces.size());
  connections_.record_send(c, SendBlocks::kNone, &blocks, packed);
  c.inflight[slot].read = true;
  ibv_send_wr wr{};
  wr.wr_id = slot;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;  // each READ's completion hands its buffers on
  wr.sg_list = sge.data();
  wr.num_sge = static_cast<int>(pieces.size());
  wr.wr.rdma.remote_addr = address;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_.get(), &wr, &bad); rc != 0) {
    spdlog::warn("connection {} ({}): ibv_post_send (RDMA READ): {}", c.id, c.peer, std::strerror(rc));
    // Back to the caller's array: it lets them go.
    for (std::size_t i = 0; i < pieces.size(); ++i) blocks[i] = std::move(c.inflight[slot].refs[i]);
    connections_.unrecord_send(c);
    return false;
  }
  connections_.set_awaits_send(c, true);  // its completion must wake the worker
  return true;
}

bool RdmaLink::qp_in_error() const {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  return ibv_query_qp(qp_.get(), &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR;
}

bool RdmaLink::reclaim_if_idle(const Connection& c, std::chrono::steady_clock::time_point now) {
  if (c.state != ConnState::kOpen || now - last_data_ < RdmaPort::kIdleReclaim) return false;
  if (asked_at_ != std::chrono::steady_clock::time_point{} && now - asked_at_ < RdmaPort::kIdleReclaim)
    return false;
  if (credits.window() <= RdmaPort::kMinWindow) return false;
  // Credits it used and we still owe are simply kept; the rest it must give back.
  credits.withhold(std::min(credits.owed(), credits.window() - RdmaPort::kMinWindow));
  sync_charge();
  const std::uint32_t ask =
      std::min(credits.outstanding(),
               credits.window() > RdmaPort::kMinWindow ? credits.window() - RdmaPort::kMinWindow : 0);
  if (ask == 0) return false;
  release_ask_ = ask;
  asked_at_ = now;
  ctx_.stats.credit_reclaims.add();
  return true;
}

std::uint32_t RdmaLink::take_imm(const Connection& c) {
  std::uint32_t returned = 0;
  // A stalled publisher waits for its credits; so does a connection whose
  // frames wait for its login's verdict (what it can send meanwhile stays bounded).
  if (!c.input_held()) {
    // A credit returned claims one posted receive of the port's SRQ.
    returned = credits.take_owed(port_.credit_budget());
    port_.outstanding += returned;
    if (credits.owed() > 0) port_.budget_short = true;
  }
  return proto::encode_credit_imm({returned, std::exchange(release_ask_, 0)});
}

void RdmaLink::flush() {
  Connection& c = connection();
  auto& staged = port_.staged;
  staged.clear();
  bool awaits_ready = false;
  while (c.can_send()) {
    // Fragments bound for a landing area go by WRITE, which takes no credit;
    // those of a client that answers wait for its RDV_READY (SPEC.md §3.9):
    // meanwhile the queue is as good as empty, and owed credits go back.
    if (!c.landings.empty()) {
      const auto run = stage_write(c);
      if (run == Connections::LandingRun::kTaken) continue;
      awaits_ready = run == Connections::LandingRun::kAwaitsReady;
    }
    const bool has_data = !c.outq.empty() && !awaits_ready;
    if (!has_data || !credits.can_send_data()) {
      if (has_data) ctx_.stats.credit_stalls.add();
      // Nothing to carry credits, or no credit for data: owed credits go
      // back alone if the client needs them, on the reserved last credit if
      // need be (SPEC.md §5: without this both sides can wait forever).
      const bool ask = release_ask_ > 0;
      if (credits.should_return() && port_.credit_budget() == 0) port_.budget_short = true;
      if ((ask || (credits.should_return() && port_.credit_budget() > 0)) &&
          credits.can_send_credit_update()) {
        const std::uint32_t imm = take_imm(c);
        if (imm > 0) {
          stage_send(c, SendBlocks::kNone, nullptr, 0, imm, nullptr, PackedSend{});
          ctx_.stats.credit_updates.add();
        }
      }
      break;
    }
    Segment sge[kMaxSendSge];
    std::array<BufferRef, kMaxFramesPerSend> refs;
    PackedSend packed;
    const std::uint32_t block = connections_.pack_next(c, port_.max_sge, port_.send_blocks_lkey(),
                                                       port_.device.pool_mr->lkey, sge, refs, packed);
    if (block == SendBlocks::kNone) break;
    stage_send(c, block, sge, packed.num_sge, take_imm(c), &refs, packed);
  }
  post_staged(c);
  // Data left with a credit to carry it (or bound for a landing area, which
  // needs none) waits for a send slot or a send block: only a send
  // completion frees one, so the send CQ must wake us; so must a rendezvous
  // READ's completion.
  connections_.set_awaits_send(
      c, (!c.outq.empty() && !awaits_ready && (credits.can_send_data() || !c.landings.empty())) ||
             c.rendezvous.reads > 0);
}

void RdmaLink::stage_send(Connection& c, std::uint32_t block, const Segment* sge, std::uint32_t num_sge,
                          std::uint32_t imm, std::array<BufferRef, kMaxFramesPerSend>* refs,
                          const PackedSend& packed) {
  const std::uint32_t slot = c.inflight_tail();
  connections_.record_send(c, block, refs, packed);
  auto& st = port_.staged.emplace_back();
  for (std::uint32_t i = 0; i < num_sge; ++i) st.sge[i] = ibv_sge{sge[i].addr, sge[i].length, sge[i].lkey};
  st.wr = ibv_send_wr{};
  st.wr.wr_id = slot;
  st.wr.opcode = IBV_WR_SEND_WITH_IMM;
  st.wr.imm_data = htonl(imm);
  st.wr.sg_list = st.sge.data();
  st.wr.num_sge = static_cast<int>(num_sge);
  // Small sends (a lone message at light load, control frames) go inline:
  // the device copies them at post time instead of reading them by DMA
  // afterwards, one round trip over the bus less. The buffers stay
  // referenced until the completion all the same (one rule for every send).
  std::uint32_t bytes = 0;
  for (std::uint32_t i = 0; i < num_sge; ++i) bytes += sge[i].length;
  if (bytes > 0 && bytes <= max_inline_) st.wr.send_flags = IBV_SEND_INLINE;
  st.frames = packed.frames;
  credits.consume_send();
}

Connections::LandingRun RdmaLink::stage_write(Connection& c) {
  Segment sge[kMaxFramesPerSend];
  std::array<BufferRef, kMaxFramesPerSend> refs;
  PackedSend packed;
  std::uint64_t remote = 0;
  std::uint32_t rkey = 0;
  const auto run = connections_.take_landing_run(c, port_.max_sge, port_.device.pool_mr->lkey, sge, refs,
                                                 packed, remote, rkey);
  if (run != Connections::LandingRun::kTaken) return run;
  const std::uint32_t slot = c.inflight_tail();
  connections_.record_send(c, SendBlocks::kNone, &refs, packed);
  c.inflight[slot].write = true;
  auto& st = port_.staged.emplace_back();
  for (std::uint32_t i = 0; i < packed.num_sge; ++i)
    st.sge[i] = ibv_sge{sge[i].addr, sge[i].length, sge[i].lkey};
  st.wr = ibv_send_wr{};
  st.wr.wr_id = slot;
  st.wr.opcode = IBV_WR_RDMA_WRITE;  // no receive at the client: no credit, no completion there
  st.wr.sg_list = st.sge.data();
  st.wr.num_sge = static_cast<int>(packed.num_sge);
  st.wr.wr.rdma.remote_addr = remote;
  st.wr.wr.rdma.rkey = rkey;
  st.frames = 0;  // fragments written, not frames sent (rdma.landing.writes)
  return run;
}

void RdmaLink::post_staged(Connection& c) {
  auto& staged = port_.staged;
  if (staged.empty()) return;
  // One ibv_post_send for the whole chain (on Soft-RoCE each post is a system
  // call) and one completion for it: only the last WR is signaled, and its
  // completion retires every send before it (an RC send queue completes in
  // order), so a batch of N sends costs one CQE instead of N.
  for (std::size_t i = 0; i + 1 < staged.size(); ++i) staged[i].wr.next = &staged[i + 1].wr;
  staged.back().wr.send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_.get(), &staged.front().wr, &bad);
  std::size_t posted = staged.size();
  if (rc != 0) {
    const int err = errno;
    posted = 0;  // bad: the first WR not posted
    while (posted < staged.size() && &staged[posted].wr != bad) ++posted;
    // Never posted: undo their records, newest first (they are the ring's tail).
    for (std::size_t i = staged.size(); i-- > posted;) connections_.unrecord_send(c);
    spdlog::warn("connection {} ({}): ibv_post_send: {}", c.id, c.peer, std::strerror(err));
    ctx_.stats.wc_errors.add();
  }
  for (std::size_t i = 0; i < posted; ++i) {
    if (staged[i].wr.opcode == IBV_WR_RDMA_WRITE) continue;  // rdma.landing.writes counts them
    ctx_.stats.sends_posted.add();
    ctx_.stats.frames_sent.add(staged[i].frames);
  }
  staged.clear();
  if (rc != 0) connections_.close(c, CloseReason::kWorkCompletionError);
}

}  // namespace rdmabroker::daemon
