// SPDX-License-Identifier: Apache-2.0
#include "rdma/rdma_port.hpp"

#include <sys/epoll.h>

#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "frames/frame_handler.hpp"
#include "rdma/rdma_link.hpp"
#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::daemon {

namespace {

Error sys_error(const std::string& what) {
  return Error{ErrorKind::kResource, what + ": " + std::strerror(errno)};
}

}  // namespace

Result<std::unique_ptr<RdmaPort>> RdmaPort::create(Device& dev, WorkerContext& ctx, Connections& connections,
                                                   FrameHandler& frames, const SendBlocks& blocks,
                                                   std::uint32_t max_connections, int epoll_fd,
                                                   EpollTags tags) {
  std::unique_ptr<RdmaPort> port(new RdmaPort(dev, ctx, connections, frames));
  if (auto st = port->size_receive_queue(); !st) return st.error();
  const std::uint32_t window = ctx.options.max_inflight_sends + 1;
  if (auto st = port->create_cqs(std::uint64_t{max_connections} * window, window); !st) return st.error();
  ctx.stats.credit_capacity.add(port->srq_max_);
  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = port->srq_max_ + port->batch_;
  srq_attr.attr.max_sge = 1;
  srq_attr.srq_context = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ctx.index));  // Listener
  port->srq_.reset(ibv_create_srq(dev.pd.get(), &srq_attr));
  if (!port->srq_) return sys_error("ibv_create_srq(" + dev.name + ")");
  const auto region = blocks.region();
  port->send_blocks_mr_ = verbs::register_local(dev.pd.get(), region.data(), region.size());
  if (!port->send_blocks_mr_) return sys_error("ibv_reg_mr of the send blocks on " + dev.name);
  port->posted_flag_.assign(ctx.core.pool->count(), 0);
  port->staged.reserve(window);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tags.tag(0);
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, port->channel_->fd, &ev) != 0) return sys_error("epoll_ctl");
  return port;
}

Status RdmaPort::size_receive_queue() {
  const auto& attr = device.attr;
  const std::uint32_t pool = ctx_.core.pool->count();
  srq_depth_ = std::min<std::uint32_t>(ctx_.options.srq_depth, static_cast<std::uint32_t>(attr.max_srq_wr));
  max_sge = std::min<std::uint32_t>(kMaxSendSge, static_cast<std::uint32_t>(attr.max_sge));
  read_width_ = attr.max_qp_init_rd_atom > 0
                    ? std::min({max_sge, kMaxFramesPerSend, static_cast<std::uint32_t>(attr.max_sge_rd)})
                    : 0;
  const std::uint32_t workers = ctx_.core.options.workers;
  const std::uint32_t ports_total = workers * std::max(ctx_.core.rdma_devices, 1u);
  // What every SRQ keeps posted must leave half the pool to queued messages,
  // TCP reads and routes: 8 workers x 2 devices x 1,024 receives would take
  // all of the default 8,192 buffers, and the SRQs created first would
  // starve the others and every TCP client.
  const std::uint32_t share = pool / (2 * ports_total);
  if (share < kMinSrqDepth) {
    return Error{ErrorKind::kResource,
                 "buffers.pool " + std::to_string(pool) + " is too small for " + std::to_string(ports_total) +
                     " receive queues (workers x devices): each needs " + std::to_string(kMinSrqDepth) +
                     " receives from half the pool; raise buffers.pool to " +
                     std::to_string(2 * ports_total * kMinSrqDepth) + " or run fewer workers"};
  }
  if (srq_depth_ > share) {
    if (ctx_.index == 0 && device.index == 0) {  // said once
      spdlog::warn(
          "buffers.srq_depth {} x {} receive queues ({} workers x {} devices) would keep {} of the pool's {} "
          "buffers posted: each keeps {} (half the pool; raise buffers.pool or lower buffers.srq_depth)",
          srq_depth_, ports_total, workers, ports_total / workers, std::uint64_t{srq_depth_} * ports_total,
          pool, share);
    }
    srq_depth_ = share;
  }
  // The SRQ may grow to hold the windows of credits by demand (srq_max):
  // up to half the pool's share of this port (the rest carries queued
  // messages and TCP), never below srq_depth; plus one refill batch, so that
  // refills stay batched when the windows reach srq_max.
  batch_ = std::max(1u, srq_depth_ / 4);
  const auto max_srq_wr = static_cast<std::uint32_t>(attr.max_srq_wr);
  srq_max_ = std::min(std::max(srq_depth_, share), max_srq_wr > batch_ ? max_srq_wr - batch_ : 1u);
  return {};
}

Status RdmaPort::create_cqs(std::uint64_t send_cqe, std::uint32_t window) {
  // Two CQs on one completion channel. Every receive needs a slot on the
  // receive CQ (the SRQ's size); every signaled send one on the send CQ (a
  // full send window on every connection this worker may hold). The receive
  // CQ is armed whenever the loop sleeps; the send CQ only while something
  // waits on a send (arm()), so that a delivery's completion wakes nobody.
  const auto max_cqe = static_cast<std::uint64_t>(device.attr.max_cqe);
  const std::string& name = device.name;
  channel_.reset(ibv_create_comp_channel(device.context));
  if (!channel_) return sys_error("ibv_create_comp_channel(" + name + ")");
  if (!set_nonblocking(channel_->fd)) return sys_error("O_NONBLOCK on the completion channel");
  const auto create_cq = [&](verbs::CqPtr& cq, verbs::CqEventAcker& acker, std::uint64_t want) -> Status {
    const int cqe = static_cast<int>(std::min(want, max_cqe));
    cq.reset(ibv_create_cq(device.context, cqe, nullptr, channel_.get(), 0));
    if (!cq) return sys_error("ibv_create_cq(" + name + ", " + std::to_string(cqe) + ")");
    acker.attach(cq.get());
    return {};
  };
  if (auto st = create_cq(recv_cq_, recv_acker_, std::uint64_t{srq_max_} + batch_); !st) return st;
  // The device may grant less (its max_cqe): the SRQ must fit its CQ.
  if (const auto granted = static_cast<std::uint32_t>(recv_cq_->cqe); granted < srq_max_ + batch_) {
    if (granted < 2 * batch_) {
      return Error{ErrorKind::kResource, "the receive CQ on " + name + " has " + std::to_string(granted) +
                                             " entries: too few for a receive queue"};
    }
    const std::uint32_t cut = granted - batch_;
    spdlog::warn("worker {}: {} has a CQ of {} entries: receive queue cut from {} to {}", ctx_.index, name,
                 granted, srq_max_, cut);
    srq_max_ = cut;
    srq_depth_ = std::min(srq_depth_, cut);
  }
  if (const std::uint32_t forced = fault::cq_entries_override(); forced > 0) send_cqe = forced;
  if (auto st = create_cq(send_cq_, send_acker_, send_cqe); !st) return st;
  // What the device granted is the budget of send windows (cq_has_room).
  cq_capacity = static_cast<std::uint32_t>(send_cq_->cqe);
  if (cq_capacity < window) {
    return Error{ErrorKind::kResource, "the send CQ on " + name + " has " + std::to_string(cq_capacity) +
                                           " entries: too few for one connection"};
  }
  return {};
}

RdmaPort::~RdmaPort() {
  if (srq_) ctx_.stats.credit_capacity.add(-static_cast<std::int64_t>(srq_max_));
  srq_.reset();
  for (std::uint32_t i = 0; i < posted_flag_.size(); ++i) {
    if (posted_flag_[i] != 0) ctx_.core.pool->release(i);
  }
}

void RdmaPort::arm(bool sends_awaited) {
  if (!recv_armed_) {
    ibv_req_notify_cq(recv_cq_.get(), 0);
    recv_armed_ = true;
  }
  if (sends_awaited && !send_armed_) {
    ibv_req_notify_cq(send_cq_.get(), 0);
    send_armed_ = true;
  }
}

void RdmaPort::take_channel_events() {
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  while (ibv_get_cq_event(channel_.get(), &cq, &cq_context) == 0) {
    if (cq == send_cq_.get()) {
      send_acker_.add();
      send_armed_ = false;
    } else {
      recv_acker_.add();
      recv_armed_ = false;
    }
  }
}

template <typename OnCompletion>
bool RdmaPort::drain(ibv_cq* cq, bool receives, OnCompletion&& on_completion) {
  ibv_wc wcs[32];
  bool any = false;
  int n;
  while ((n = ibv_poll_cq(cq, 32, wcs)) > 0) {
    any = true;
    // What these completions brought was received by now: its relay time
    // (SPEC.md §3.4) counts from here, not from a clock reading taken
    // before the poll, which a thread preempted in between took too early.
    if (receives) ctx_.now = std::chrono::steady_clock::now();
    ctx_.stats.completions_per_poll.observe(n);
    for (int i = 0; i < n; ++i) {
      if constexpr (fault::kEnabled) {
        if (wc_faults_armed > 0) inject_wc_fault(wcs[i], receives);
      }
      on_completion(wcs[i]);
    }
    if (n < 32) break;
  }
  if (n < 0) spdlog::error("worker {}: ibv_poll_cq on {} failed", ctx_.index, device.name);
  return any;
}

bool RdmaPort::poll() {
  const bool received =
      drain(recv_cq_.get(), true, [&](const ibv_wc& wc) { on_receive(connections_, frames_, wc); });
  return reap_sends() || received;
}

bool RdmaPort::reap_sends() {
  return drain(send_cq_.get(), false, [&](const ibv_wc& wc) { on_send_complete(connections_, wc); });
}

void RdmaPort::after_flush() {
  on_timers(connections_, ctx_.now);
  refill(connections_);
  if (!read_waiting_.empty()) {
    // Offers that waited for pool buffers or a stall's end read on (each may wait again).
    auto waiting = std::move(read_waiting_);
    read_waiting_.clear();
    for (const std::uint64_t id : waiting) {
      if (Connection* c = connections_.find(id); c != nullptr) frames_.read_more(*c);
    }
    connections_.flush_touched();
  }
}

RdmaLink* RdmaPort::link_of(std::uint32_t qp_num, Connection** c) {
  auto it = by_qp.find(qp_num);
  if (it == by_qp.end()) return nullptr;
  *c = it->second;
  return static_cast<RdmaLink*>(it->second->link.get());
}

void RdmaPort::on_receive(Connections& connections, FrameHandler& frames, const ibv_wc& wc) {
  const auto index = static_cast<std::uint32_t>(wc.wr_id);
  BufferRef buf(ctx_.core.pool, index);  // adopts the reference the SRQ held
  posted_flag_[index] = 0;
  --posted_;
  ctx_.stats.srq_posted.add(-1);
  ctx_.stats.receives.add();
  Connection* c = nullptr;
  RdmaLink* link = link_of(wc.qp_num, &c);
  if (link == nullptr) {
    ctx_.stats.orphan_receives.add();
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      ctx_.stats.wc_errors.add();
      spdlog::warn("connection {} ({}): receive failed: {}", c->id, c->peer, ibv_wc_status_str(wc.status));
    }
    connections.close(*c, CloseReason::kWorkCompletionError);
    return;
  }
  if (!link->credits.on_receive()) {
    connections.close(*c, CloseReason::kProtocolError, proto::ErrorCode::kProtocolViolation,
                      "SEND without a credit");
    return;
  }
  --outstanding;
  const std::uint32_t imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0 ? ntohl(wc.imm_data) : 0;
  // A SEND that starts with a PUBLISH earns credits (SPEC.md §5.1); control frames do not.
  const bool publishes =
      wc.byte_len >= proto::kHeaderSize &&
      proto::load<std::uint8_t>(buf.data() + 3) == static_cast<std::uint8_t>(proto::FrameType::kPublish);
  if (!link->on_credit_imm(imm, wc.byte_len > 0, publishes)) {
    connections.close(*c, CloseReason::kProtocolError, proto::ErrorCode::kProtocolViolation,
                      "gave back more credits than it held");
    return;
  }
  // The client may send as soon as it sees ESTABLISHED; its data can reach our
  // CQ before our own ESTABLISHED event reaches the CM channel.
  connections.establish(*c);
  connections.touch(*c);
  if (c->is_up()) frames.process(*c, buf, 0, wc.byte_len);
}

void RdmaPort::on_send_complete(Connections& connections, const ibv_wc& wc) {
  Connection* c = nullptr;
  if (link_of(wc.qp_num, &c) == nullptr) return;  // destroyed after its deadline; refs were released then
  if (c->inflight_count == 0) return;
  // Only the last send of each posted chain is signaled (RdmaLink::post_staged):
  // this completion stands for every send from the ring's head up to its slot.
  const auto size = static_cast<std::uint32_t>(c->inflight.size());
  std::uint32_t covered = (static_cast<std::uint32_t>(wc.wr_id) + size - c->inflight_head) % size + 1;
  covered = std::min(covered, c->inflight_count);
  // A send that failed by itself leaves those before it delivered; a flushed
  // one (the QP went to error) says nothing of unsignaled ones before it, and
  // they are counted as dropped, never as delivered.
  const bool before_ok = wc.status != IBV_WC_WR_FLUSH_ERR;
  for (std::uint32_t i = 1; i < covered; ++i) retire(connections, *c, before_ok);
  const bool read = c->inflight[c->inflight_head].read;
  const bool write = c->inflight[c->inflight_head].write;
  retire(connections, *c, wc.status == IBV_WC_SUCCESS);
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      ctx_.stats.wc_errors.add();
      if (read) {
        // The publisher's region could not be read (deregistered before its
        // RDV_RELEASE, a wrong rkey or length): the QP is in error, the
        // connection cannot be told and closes; its recipients get ABORT.
        ctx_.stats.rendezvous_read_errors.add();
        spdlog::warn("connection {} ({}): RDMA READ of its offered message failed: {}", c->id, c->peer,
                     ibv_wc_status_str(wc.status));
      } else if (write) {
        // The subscriber's landing area could not be written (deregistered
        // before its message's last fragment, a wrong rkey or address): the
        // QP is in error and the connection closes; its messages are dropped.
        ctx_.stats.landing_write_errors.add();
        spdlog::warn("connection {} ({}): RDMA WRITE into its landing area failed: {}", c->id, c->peer,
                     ibv_wc_status_str(wc.status));
      } else {
        spdlog::warn("connection {} ({}): send failed: {}", c->id, c->peer, ibv_wc_status_str(wc.status));
      }
    } else if (read && c->is_up()) {
      ctx_.stats.rendezvous_read_errors.add();
    }
    connections.close(*c, CloseReason::kWorkCompletionError);
    connections.try_finish(*c);
    return;
  }
  if (c->state == ConnState::kDisconnecting) {
    connections.try_finish(*c);
    return;
  }
  connections.on_sent(*c);
}

void RdmaPort::retire(Connections& connections, Connection& c, bool success) {
  InflightSend& rec = c.inflight[c.inflight_head];
  if (!rec.read || !success) {
    connections.retire_send(c, success);
    return;
  }
  // A rendezvous READ brought its buffers' fragments: routed now (frames/rendezvous.cpp).
  std::array<BufferRef, kMaxFramesPerSend> blocks;
  const std::uint32_t count = rec.frames;
  for (std::uint32_t i = 0; i < count; ++i) blocks[i] = std::move(rec.refs[i]);
  rec.frames = 0;
  connections.retire_send(c, true);
  frames_.on_read(c, blocks, count);
}

std::uint32_t RdmaPort::fair_window(std::uint32_t configured) const {
  return std::max(kMinWindow, std::min(configured, srq_max_ / std::max(1u, publishers_)));
}

std::uint32_t RdmaPort::srq_target() const {
  // Windows may pass srq_max by a credit or two (keep_at_least after a
  // crossed give-back); the SRQ itself holds srq_max_ + batch_ at most.
  return std::min(srq_max_ + batch_, std::max(srq_depth_, windows_total + batch_));
}

void RdmaPort::on_timers(Connections& connections, std::chrono::steady_clock::time_point now) {
  if (now >= next_rebalance_) {
    next_rebalance_ = now + kRebalanceInterval;
    rebalance(connections, now);
  }
  if (now >= next_qp_check_) {
    next_qp_check_ = now + kQpCheckInterval;
    check_idle_qps(connections, now);
  }
}

void RdmaPort::rebalance(Connections& connections, std::chrono::steady_clock::time_point now) {
  std::uint32_t publishers = 0;
  for (auto& [qp, c] : by_qp) {
    auto& link = static_cast<RdmaLink&>(*c->link);
    if (!link.by_demand()) continue;
    if (now - link.last_data() < kIdleReclaim) ++publishers;
    if (link.reclaim_if_idle(*c, now)) connections.touch(*c);
  }
  publishers_ = publishers;
}

void RdmaPort::check_idle_qps(Connections& connections, std::chrono::steady_clock::time_point now) {
  // A connection with traffic learns of a dead QP from its next completion
  // (flushed in error); an idle one is asked (one system call each, once a
  // second): a QP the peer broke must not hold its connection, slot and
  // credits until the peer leaves.
  std::vector<Connection*> dead;
  for (auto& [qp, c] : by_qp) {
    auto& link = static_cast<RdmaLink&>(*c->link);
    if (c->is_up() && now - link.last_data() >= kQpCheckInterval && link.qp_in_error()) dead.push_back(c);
  }
  for (Connection* c : dead) {
    log_throttled(ctx_.core.cm_error_log, spdlog::level::warn,
                  "connection {} ({}): its QP is in the error state without an event (a bad RDMA operation "
                  "from the peer?): closed",
                  c->id, c->peer);
    connections.close(*c, CloseReason::kQpFatal);
  }
}

void RdmaPort::refill(Connections& connections, std::uint32_t to_grant) {
  // Refills come in batches (a quarter of srq_depth), not per receive,
  // unless a window (or `to_grant` more) has no receive behind it.
  const std::uint32_t target = srq_target();
  if (posted_ >= target || (target - posted_ < batch_ && posted_ >= windows_total + to_grant)) return;
  if (post_receives(target - posted_) == 0) return;  // pool empty: retried on the next loop turn
  if (!limit_armed_ && limit_usable_ && posted_ > batch_) arm_limit();
  // Credits that waited for budget can go back now (a scan of every
  // connection: only after a shortage, not on every refill).
  if (budget_short) {
    budget_short = false;
    for (auto& [qp, c] : by_qp) {
      if (static_cast<RdmaLink&>(*c->link).credits.owed() > 0) connections.touch(*c);
    }
  }
}

std::size_t RdmaPort::post_receives(std::uint32_t want) {
  std::vector<std::uint32_t> idx(want);
  const std::size_t got = ctx_.core.pool->acquire(idx.data(), want);
  ctx_.note_pool_starved(got == 0);
  if (got == 0) return 0;
  std::vector<ibv_recv_wr> wrs(got);
  std::vector<ibv_sge> sges(got);
  const std::uint32_t lkey = device.pool_mr->lkey;
  for (std::size_t i = 0; i < got; ++i) {
    sges[i] = ibv_sge{reinterpret_cast<std::uint64_t>(ctx_.core.pool->data(idx[i])),
                      ctx_.core.pool->buffer_size(), lkey};
    wrs[i].wr_id = idx[i];
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < got ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  std::size_t posted = got;
  if (ibv_post_srq_recv(srq_.get(), wrs.data(), &bad) != 0) {
    posted = static_cast<std::size_t>(bad - wrs.data());
    spdlog::error("worker {}: ibv_post_srq_recv on {} failed after {} of {}", ctx_.index, device.name, posted,
                  got);
    for (std::size_t i = posted; i < got; ++i) ctx_.core.pool->release(idx[i]);
  }
  for (std::size_t i = 0; i < posted; ++i) posted_flag_[idx[i]] = 1;
  posted_ += static_cast<std::uint32_t>(posted);
  ctx_.stats.srq_posted.add(static_cast<std::int64_t>(posted));
  ctx_.stats.srq_refills.add();
  return posted;
}

void RdmaPort::arm_limit() {
  ibv_srq_attr attr{};
  attr.srq_limit = batch_;
  if (const int rc = ibv_modify_srq(srq_.get(), &attr, IBV_SRQ_LIMIT); rc != 0) {
    limit_usable_ = false;
    spdlog::info("worker {}: {} takes no receive queue limit ({}); its low-receives alarm is off", ctx_.index,
                 device.name, std::strerror(rc));
    return;
  }
  limit_armed_ = true;
}

void RdmaPort::on_srq_limit() {
  limit_armed_ = false;
  ctx_.stats.srq_limit_events.add();
  spdlog::warn(
      "worker {}: {}'s receive queue is down to less than {} receives (of {} posted when last polled; "
      "pool: {} of {} in use): the worker is behind its senders or the pool is short",
      ctx_.index, device.name, batch_, posted_, ctx_.core.pool->in_use(), ctx_.core.pool->count());
}

void RdmaPort::inject_wc_fault(ibv_wc& wc, bool receive) {
  Connection* c = nullptr;
  RdmaLink* link = link_of(wc.qp_num, &c);
  if (link == nullptr || !link->fail_next_wc) return;
  link->fail_next_wc = false;
  --wc_faults_armed;
  // A failed work request leaves its QP in the error state; everything still
  // posted then completes as flushed. The completion itself reads as a
  // device error of its direction.
  wc.status = receive ? IBV_WC_LOC_PROT_ERR : IBV_WC_REM_ACCESS_ERR;
  link->force_error();
  spdlog::warn("fault: a completion of connection {} reported as {}", c->id, ibv_wc_status_str(wc.status));
}

}  // namespace rdmabroker::daemon
