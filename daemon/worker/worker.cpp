// Worker: event loop, per-device resources, commands and CM events.
// Data-path handling (receive, route, flush, close) is in connection_io.cpp.
#include "worker/worker.hpp"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

namespace rdmabroker::daemon {

Worker::Worker(std::uint32_t index, BrokerCore& core)
    : index_(index), core_(core), opt_(core.options), auth_(core.auth) {}

Worker::~Worker() {
  join();
  handshakes_.clear();
  // Explicit teardown order: QPs and cm_ids, then SRQs (returning the buffers
  // still posted on them), then CQs and channels with the rest of the port.
  connections_.clear();
  for (auto& port : ports_) {
    port->srq.reset();
    for (std::uint32_t i = 0; i < port->posted_flag.size(); ++i) {
      if (port->posted_flag[i] != 0) core_.pool->release(i);
    }
    port->posted_flag.clear();
  }
  ports_.clear();
}

Status Worker::init(int tcp_listen_fd) {
  auto sys_error = [](const std::string& what) {
    return Error{ErrorKind::kResource, what + ": " + std::strerror(errno)};
  };
  send_blocks_.reset(new std::byte[std::size_t{opt_.send_blocks} * kSendBlockSize]());
  free_blocks_.reserve(opt_.send_blocks);
  staged_.reserve(opt_.max_inflight_sends + 1);
  for (std::uint32_t b = opt_.send_blocks; b-- > 0;) free_blocks_.push_back(b);

  if (!commands_.valid()) return sys_error("eventfd");
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return sys_error("epoll_create1");
  auto watch = [&](int fd, std::uint64_t tag, std::uint32_t extra = 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | extra;
    ev.data.u64 = tag;
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
  };
  if (!watch(commands_.fd(), kTagCommands)) return sys_error("epoll_ctl");
  if (core_.devices != nullptr) {  // RDMA enabled
    cm_channel_.reset(rdma_create_event_channel());
    if (!cm_channel_) return sys_error("rdma_create_event_channel");
    if (!set_nonblocking(cm_channel_->fd)) return sys_error("O_NONBLOCK on the CM channel");
    if (!watch(cm_channel_->fd, kTagCm)) return sys_error("epoll_ctl");
  }
  tcp_listen_fd_ = tcp_listen_fd;
  // EPOLLEXCLUSIVE: one worker is woken per incoming connection.
  if (tcp_listen_fd_ >= 0 && !watch(tcp_listen_fd_, kTagTcpListen, EPOLLEXCLUSIVE))
    return sys_error("epoll_ctl");

  const std::uint32_t per_worker_conns =
      opt_.max_connections / static_cast<std::uint32_t>(core_.workers.size()) + 1;
  static const std::vector<std::unique_ptr<Device>> kNoDevices;
  for (const auto& dev : core_.devices != nullptr ? core_.devices->devices() : kNoDevices) {
    auto port = std::make_unique<DevicePort>();
    port->device = dev.get();
    const auto& attr = dev->attr;
    port->srq_depth = std::min<std::uint32_t>(opt_.srq_depth, static_cast<std::uint32_t>(attr.max_srq_wr));
    port->max_sge = std::min<std::uint32_t>(kMaxSendSge, static_cast<std::uint32_t>(attr.max_sge));
    // Every signaled send and every receive needs a CQ slot: size for the SRQ
    // plus a full send window on every connection this worker may hold.
    const std::uint32_t window = opt_.max_inflight_sends + 1;
    const std::uint64_t want = std::uint64_t{port->srq_depth} + std::uint64_t{per_worker_conns} * window;
    int cqe = static_cast<int>(std::min<std::uint64_t>(want, static_cast<std::uint64_t>(attr.max_cqe)));
    if (const std::uint32_t forced = fault::cq_entries_override(); forced > 0) cqe = static_cast<int>(forced);
    port->channel.reset(ibv_create_comp_channel(dev->context));
    if (!port->channel) return sys_error("ibv_create_comp_channel(" + dev->name + ")");
    if (!set_nonblocking(port->channel->fd)) return sys_error("O_NONBLOCK on the completion channel");
    port->cq.reset(ibv_create_cq(dev->context, cqe, nullptr, port->channel.get(), 0));
    if (!port->cq) return sys_error("ibv_create_cq(" + dev->name + ", " + std::to_string(cqe) + ")");
    port->acker.attach(port->cq.get());
    // The device may round the size up; what it granted is the budget. The
    // SRQ must fit with at least one connection's window beside it.
    port->cq_capacity = static_cast<std::uint32_t>(port->cq->cqe);
    if (port->cq_capacity < port->srq_depth + window) {
      if (port->cq_capacity < 2 * window) {
        return Error{ErrorKind::kResource, "the CQ on " + dev->name + " has " +
                                               std::to_string(port->cq_capacity) +
                                               " entries: too few for a receive queue and one connection"};
      }
      spdlog::warn("worker {}: {} has a CQ of {} entries: receive queue cut from {} to {}", index_, dev->name,
                   port->cq_capacity, port->srq_depth, port->cq_capacity - window);
      port->srq_depth = port->cq_capacity - window;
    }
    port->cq_reserved = port->srq_depth;
    ibv_srq_init_attr srq_attr{};
    srq_attr.attr.max_wr = port->srq_depth;
    srq_attr.attr.max_sge = 1;
    port->srq.reset(ibv_create_srq(dev->pd.get(), &srq_attr));
    if (!port->srq) return sys_error("ibv_create_srq(" + dev->name + ")");
    port->send_blocks_mr = verbs::register_local(dev->pd.get(), send_blocks_.get(),
                                                 std::size_t{opt_.send_blocks} * kSendBlockSize);
    if (!port->send_blocks_mr) return sys_error("ibv_reg_mr of the send blocks on " + dev->name);
    port->posted_flag.assign(core_.pool->count(), 0);
    if (!watch(port->channel->fd, ports_.size())) return sys_error("epoll_ctl");
    ports_.push_back(std::move(port));
  }
  remote_.resize(core_.workers.size());
  refill_srqs();
  return {};
}

void Worker::start() {
  thread_ = std::thread([this] { run(); });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::run() {
  while (true) {
    now_ = std::chrono::steady_clock::now();
    heartbeat_.store(now_.time_since_epoch().count(), std::memory_order_relaxed);
    handle_commands();
    handle_cm_events();
    if constexpr (fault::kEnabled) {
      if (!delayed_cm_.empty()) deliver_delayed_cm_events();
    }
    bool busy = false;
    for (auto& port : ports_) busy |= poll_port(*port);
    if (busy) {
      last_work_ = now_;
    } else if (opt_.busy_poll_us > 0) {
      busy = spin_poll();
    }
    post_remote_batches();
    flush_touched();
    refill_srqs();
    retry_buffer_waiters();
    check_deadlines();
    check_write_deadlines();
    reap();
    if (stopping_ && connections_.empty() && handshakes_.empty()) break;
    // Stalled publishers and closing connections need timely deadline checks.
    if (!busy) {
      wait_events(!stalled_.empty() ? 1 : stopping_ ? 50 : 200);
    } else if (stats_.tcp_connections.get() > 0 || !handshakes_.empty() || now_ >= next_socket_check_) {
      // While completions keep the loop busy, sockets are still looked at:
      // every turn when this worker has TCP connections, else every
      // millisecond (for the listening socket). A pure-RDMA load pays no
      // extra system call per turn.
      next_socket_check_ = now_ + std::chrono::milliseconds(1);
      wait_events(0);
    }
  }
  spdlog::debug("worker {}: stopped", index_);
}

bool Worker::spin_poll() {
  // Busy polling (flow.busy_poll_us): within that time of the last work, a
  // completion is picked up as it lands instead of after a wake-up through
  // the completion channel, at the price of a core. Only the CQs are polled
  // while spinning (no system call); commands, CM events and sockets are
  // looked at when the spin ends or finds work.
  const auto until = last_work_ + std::chrono::microseconds(opt_.busy_poll_us);
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
    for (auto& port : ports_) {
      if (poll_port(*port)) {
        now_ = std::chrono::steady_clock::now();
        last_work_ = now_;
        return true;
      }
    }
    if ((i & 63) == 63 && commands_.pending()) return true;
  }
  return false;
}

void Worker::wait_events(int timeout_ms) {
  if (timeout_ms > 0) {
    // Arm every CQ, then poll once more: a completion that arrived between
    // the last empty poll and the arm raises no event, and would otherwise
    // sit in the CQ until something else woke us.
    for (auto& port : ports_) {
      if (!port->armed) {
        ibv_req_notify_cq(port->cq.get(), 0);
        port->armed = true;
      }
    }
    bool busy = false;
    for (auto& port : ports_) busy |= poll_port(*port);
    if (busy) timeout_ms = 0;
  }
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_.get(), events, 64, timeout_ms);
  now_ = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tag = events[i].data.u64;
    switch (tag & kTagMask) {
      case kTagCommands:
      case kTagCm:
        continue;  // handled at the top of the loop
      case kTagTcpListen:
        accept_tcp();
        continue;
      case kTagHandshake:
        on_handshake_readable(static_cast<int>(tag & ~kTagMask));
        continue;
      case kTagTcpConnection:
        if (Connection* c = find(tag & ~kTagMask)) on_tcp_event(*c, events[i].events);
        continue;
      default:
        break;
    }
    DevicePort& port = *ports_[tag];
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(port.channel.get(), &cq, &ctx) == 0) {
      port.acker.add();
      port.armed = false;
    }
  }
}

bool Worker::poll_port(DevicePort& port) {
  ibv_wc wcs[32];
  bool any = false;
  int n;
  while ((n = ibv_poll_cq(port.cq.get(), 32, wcs)) > 0) {
    any = true;
    stats_.completions_per_poll.observe(n);
    for (int i = 0; i < n; ++i) {
      if constexpr (fault::kEnabled) {
        if (wc_faults_armed_ > 0) inject_wc_fault(wcs[i], port);
      }
      // The opcode of an error completion is undefined: tell receives from
      // sends by the wr_id we chose.
      if ((wcs[i].wr_id & kRecvFlag) != 0) {
        on_receive(port, wcs[i]);
      } else {
        on_send_complete(port, wcs[i]);
      }
    }
    if (n < 32) break;
  }
  if (n < 0) spdlog::error("worker {}: ibv_poll_cq on {} failed", index_, port.device->name);
  return any;
}

void Worker::handle_commands() {
  commands_.drain(command_scratch_);
  for (auto& cmd : command_scratch_) {
    if (auto* a = std::get_if<AcceptCommand>(&cmd)) {
      handle_accept(*a);
    } else if (auto* d = std::get_if<DeliverCommand>(&cmd)) {
      for (auto& d : d->items) {
        Connection* c = find(d.connection);
        if (c == nullptr || c->state != ConnState::kEstablished) {
          stats_.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add(d.item.messages);
          unqueue(d.slot, d.item.body_len);
          continue;
        }
        enqueue(*c, std::move(d.item));
      }
    } else if (auto* q = std::get_if<QpFatalCommand>(&cmd)) {
      Connection* c = find(q->connection_id);
      if (c != nullptr && (!q->only_if_open || c->state == ConnState::kEstablished)) {
        spdlog::warn("connection {} ({}): {}", c->id, c->peer, q->event);
        close(*c, CloseReason::kQpFatal);
      }
    } else if (auto* r = std::get_if<ReloadCommand>(&cmd)) {
      // Only what config::diff() marks live can differ here.
      opt_.max_payload = r->options.max_payload;
      opt_.max_subscriptions = r->options.max_subscriptions;
      opt_.max_pending_bytes = r->options.max_pending_bytes;
      opt_.max_subscriptions_total = r->options.max_subscriptions_total;
      opt_.max_subscription_memory = r->options.max_subscription_memory;
      opt_.max_pending_bytes_total = r->options.max_pending_bytes_total;
      opt_.write_deadline_ms = r->options.write_deadline_ms;
      opt_.producer_stall_ms = r->options.producer_stall_ms;
      opt_.drain_timeout_ms = r->options.drain_timeout_ms;
      opt_.busy_poll_us = r->options.busy_poll_us;
      opt_.multicast = r->options.multicast;  // its restart-only keys cannot have changed
      if (r->auth) apply_auth(r->auth);
      if (r->applied) r->applied->set_value();
    } else if (auto* ar = std::get_if<AuthResultCommand>(&cmd)) {
      on_auth_result(*ar);
    } else if (auto* f = std::get_if<FaultCommand>(&cmd)) {
      on_fault(*f);
    } else if (auto* l = std::get_if<ListConnectionsCommand>(&cmd)) {
      std::vector<ConnectionInfo> out;
      for (const auto& [id, c] : connections_) {
        out.push_back(ConnectionInfo{c->id, std::string(to_string(c->transport)), c->peer,
                                     std::string(to_string(c->state)), c->identity ? c->identity->name : "",
                                     index_, c->subscriptions.size(), c->messages_in, c->messages_out,
                                     c->bytes_in, c->bytes_out, c->pending_messages, c->pending_bytes});
      }
      l->reply->set_value(std::move(out));
    } else if (std::holds_alternative<ShutdownCommand>(cmd)) {
      stopping_ = true;
      if (tcp_listen_fd_ >= 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, tcp_listen_fd_, nullptr);
      check_handshake_deadlines();  // refuses those still in their handshake
      std::vector<Connection*> all;
      for (auto& [id, c] : connections_) all.push_back(c.get());
      for (Connection* c : all) {
        if (c->state == ConnState::kEstablished) {
          close(*c, CloseReason::kBrokerShutdown, proto::ErrorCode::kServerShutdown, "broker shutting down");
        } else {
          close(*c, CloseReason::kBrokerShutdown);
        }
      }
    }
  }
  command_scratch_.clear();
}

void Worker::reject(rdma_cm_id* id, proto::RejectReason reason) {
  auto data = proto::encode(proto::ConnectReject{reason, opt_.buffer_size});
  rdma_reject(id, data.data(), static_cast<std::uint8_t>(data.size()));
}

void Worker::handle_accept(AcceptCommand& cmd) {
  verbs::CmIdPtr id(cmd.id);
  auto fail = [&](proto::RejectReason reason, const std::string& why) {
    spdlog::warn("connection {} from {} refused: {}", cmd.connection_id, cmd.peer, why);
    stats_.accept_failures.add();
    reject(id.get(), reason);
    core_.slots->release(cmd.slot);
  };
  DevicePort* port = nullptr;
  for (auto& p : ports_) {
    if (p->device->context == id->verbs) port = p.get();
  }
  if (port == nullptr) return fail(proto::RejectReason::kNoResources, "unknown device");
  if (stopping_) return fail(proto::RejectReason::kShuttingDown, "shutting down");
  const std::uint32_t grant = std::min(opt_.credits, port->credit_budget());
  if (grant < 2)
    return fail(proto::RejectReason::kNoResources, "no receive credits left on " + port->device->name);
  const std::uint32_t window = opt_.max_inflight_sends + 1;
  if (port->cq_reserved + window > port->cq_capacity) {
    stats_.cq_full.add();
    return fail(proto::RejectReason::kNoResources, "the completion queue on " + port->device->name +
                                                       " is full (" + std::to_string(port->cq_capacity) +
                                                       " entries)");
  }

  ibv_qp_init_attr attr{};
  attr.qp_context = reinterpret_cast<void*>(static_cast<std::uintptr_t>(cmd.connection_id));
  attr.send_cq = port->cq.get();
  attr.recv_cq = port->cq.get();
  attr.srq = port->srq.get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = opt_.max_inflight_sends + 1;  // + a credit update
  attr.cap.max_send_sge = port->max_sge;
  attr.cap.max_inline_data = verbs::kInlineWanted;
  if (rdma_create_qp(id.get(), port->device->pd.get(), &attr) != 0) {
    // A device that cannot inline (or not that much) still gets the QP.
    attr.cap.max_inline_data = 0;
    if (rdma_create_qp(id.get(), port->device->pd.get(), &attr) != 0) {
      return fail(proto::RejectReason::kNoResources, std::string("rdma_create_qp: ") + std::strerror(errno));
    }
  }
  auto conn = std::make_unique<Connection>();
  conn->id = cmd.connection_id;
  conn->slot = cmd.slot;
  conn->port = port;
  conn->peer = std::move(cmd.peer);
  conn->qp = verbs::CmQp(id.get());
  conn->qp_num = id->qp->qp_num;
  conn->max_inline = attr.cap.max_inline_data;  // what the device granted
  conn->peer_buffer_size = cmd.request.recv_buffer_size;
  conn->multicast_capable = (cmd.request.flags & proto::kConnectMulticast) != 0;
  conn->credits = CreditWindow(grant);
  conn->credits.grant_initial(grant);
  conn->credits.add_send_credits(cmd.request.initial_credits);
  conn->inflight.resize(opt_.max_inflight_sends + 1);
  port->outstanding += grant;

  auto data = proto::encode(proto::ConnectAccept{opt_.buffer_size, grant, cmd.connection_id});
  rdma_conn_param param{};
  param.private_data = data.data();
  param.private_data_len = static_cast<std::uint8_t>(data.size());
  param.rnr_retry_count = 7;  // a safety net only: credits mean a receive is always posted
  if (rdma_accept(id.get(), &param) != 0) {
    spdlog::warn("connection {} from {}: rdma_accept: {}", cmd.connection_id, conn->peer,
                 std::strerror(errno));
    stats_.accept_failures.add();
    port->outstanding -= conn->credits.forfeit();
    conn->qp.reset();
    core_.slots->release(cmd.slot);
    return;
  }
  conn->cm_id = std::move(id);
  port->cq_reserved += window;
  port->by_qp[conn->qp_num] = conn.get();
  stats_.connections_current.add(1);
  connections_.emplace(conn->id, std::move(conn));
}

void Worker::handle_cm_events() {
  if (!cm_channel_) return;  // TCP only
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(cm_channel_.get(), &raw) == 0) {
    // Copy what we need and ack at once: rdma_destroy_id waits for acks.
    const rdma_cm_event_type type = raw->event;
    const int status = raw->status;
    const auto conn_id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(raw->id->context));
    rdma_ack_cm_event(raw);
    if constexpr (fault::kEnabled) {
      if (fault::Shared::take(core_.faults.cm_delays)) {
        const auto delay =
            std::chrono::milliseconds(core_.faults.cm_delay_ms.load(std::memory_order_relaxed));
        spdlog::info("fault: {} of connection {} held back {} ms", rdma_event_str(type), conn_id,
                     delay.count());
        delayed_cm_.push_back({now_ + delay, type, status, conn_id});
        continue;
      }
      if (fault::Shared::take(core_.faults.cm_duplicates)) {
        spdlog::info("fault: {} of connection {} handled twice", rdma_event_str(type), conn_id);
        on_cm_event(type, status, conn_id);
      }
    }
    on_cm_event(type, status, conn_id);
  }
}

void Worker::on_cm_event(rdma_cm_event_type type, int status, std::uint64_t conn_id) {
  Connection* c = find(conn_id);
  if (c == nullptr) {
    spdlog::debug("worker {}: {} for connection {} that is gone", index_, rdma_event_str(type), conn_id);
    return;
  }
  switch (type) {
    case RDMA_CM_EVENT_ESTABLISHED:
      establish(*c);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      c->peer_disconnected = true;
      close(*c, c->close_received ? CloseReason::kClientClose : CloseReason::kPeerDisconnected);
      try_finish(*c);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      c->peer_disconnected = true;
      close(*c, CloseReason::kDeviceRemoved);
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
      spdlog::warn("connection {} from {}: {} (status {})", c->id, c->peer, rdma_event_str(type), status);
      c->peer_disconnected = true;
      close(*c, CloseReason::kConnectFailed);
      break;
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      break;
    default:
      spdlog::debug("connection {}: CM event {}", c->id, rdma_event_str(type));
      break;
  }
}

void Worker::check_write_deadlines() {
  if (now_ < next_write_check_) return;
  next_write_check_ = now_ + std::chrono::milliseconds(100);
  const auto limit = std::chrono::milliseconds(opt_.write_deadline_ms);
  std::vector<Connection*> stuck;
  for (auto& [id, c] : connections_) {
    if (c->state == ConnState::kEstablished && c->pending_bytes > 0 && now_ - c->last_progress > limit) {
      stuck.push_back(c.get());
    }
  }
  for (Connection* c : stuck) {
    spdlog::warn("connection {} ({}): slow consumer, accepted nothing for {} ms with {} bytes queued", c->id,
                 c->peer, opt_.write_deadline_ms, c->pending_bytes);
    close(*c, CloseReason::kSlowConsumer, proto::ErrorCode::kSlowConsumer,
          "accepted nothing for " + std::to_string(opt_.write_deadline_ms) + " ms");
  }
}

void Worker::establish(Connection& c) {
  if (c.state != ConnState::kAccepting) return;
  c.state = ConnState::kEstablished;
  c.last_progress = now_;
  stats_.connections_accepted.add();
  c.auth_deadline = now_ + kAuthTimeout;
  unauthenticated_.push_back(c.id);
  if (c.transport == Transport::kRdma) {
    spdlog::info("connection {} from {} established on {} (worker {}, qp {})", c.id, c.peer,
                 c.port->device->name, index_, c.qp_num);
  } else {
    spdlog::info("connection {} from {} established over tcp (worker {})", c.id, c.peer, index_);
  }
  touch(c);  // its initial credits may already allow sends
}

void Worker::note_pool_starved(bool starved) {
  if (starved == pool_starved_) return;
  pool_starved_ = starved;
  if (starved) {
    // Receives are not reposted and credits not returned until buffers come
    // back: publishers slow down, nothing is lost. Once per shortage.
    stats_.pool_exhausted.add();
    spdlog::warn(
        "worker {}: the buffer pool is empty ({} buffers, all in use): receives wait for buffers to come "
        "back "
        "(raise buffers.count if this recurs)",
        index_, core_.pool->count());
  } else {
    spdlog::info("worker {}: buffers available again", index_);
  }
}

Connection* Worker::find(std::uint64_t id) {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.get();
}

void Worker::refill_srqs() {
  for (auto& port : ports_) {
    // Low watermark at three quarters: refills come in batches, not per receive.
    if (port->posted >= port->srq_depth - port->srq_depth / 4) continue;
    std::uint32_t want = port->srq_depth - port->posted;
    std::vector<std::uint32_t> idx(want);
    const std::size_t got = core_.pool->acquire(idx.data(), want);
    note_pool_starved(got == 0);
    if (got == 0) continue;  // pool empty: retried on the next loop turn
    std::vector<ibv_recv_wr> wrs(got);
    std::vector<ibv_sge> sges(got);
    const std::uint32_t lkey = port->device->pool_mr->lkey;
    for (std::size_t i = 0; i < got; ++i) {
      sges[i] =
          ibv_sge{reinterpret_cast<std::uint64_t>(core_.pool->data(idx[i])), core_.pool->buffer_size(), lkey};
      wrs[i].wr_id = kRecvFlag | idx[i];
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
      wrs[i].next = i + 1 < got ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    std::size_t posted = got;
    if (ibv_post_srq_recv(port->srq.get(), wrs.data(), &bad) != 0) {
      posted = static_cast<std::size_t>(bad - wrs.data());
      spdlog::error("worker {}: ibv_post_srq_recv on {} failed after {} of {}", index_, port->device->name,
                    posted, got);
      for (std::size_t i = posted; i < got; ++i) core_.pool->release(idx[i]);
    }
    for (std::size_t i = 0; i < posted; ++i) port->posted_flag[idx[i]] = 1;
    port->posted += static_cast<std::uint32_t>(posted);
    stats_.srq_posted.add(static_cast<std::int64_t>(posted));
    stats_.srq_refills.add();
    // Credits that waited for budget can go back now.
    for (auto& [qp, c] : port->by_qp) {
      if (c->credits.owed() > 0) touch(*c);
    }
  }
}

void Worker::check_deadlines() {
  // Refresh the loop's clock: take_credits_to_return() compares stalls with it.
  now_ = std::chrono::steady_clock::now();
  const auto now = now_;
  if (!stalled_.empty()) {
    // A stall ends when the subscriber it waits for has drained to half its
    // bound, or when that queue stopped shrinking for producer_stall_ms; the
    // publisher's owed credits then go back.
    const auto patience = std::chrono::milliseconds(opt_.producer_stall_ms);
    std::erase_if(stalled_, [&](std::uint64_t id) {
      Connection* c = find(id);
      if (c == nullptr) return true;
      const auto low =
          static_cast<std::int64_t>(core_.backlog_bound(c->stall_slot, opt_.max_pending_bytes) / 2);
      const std::int64_t queued = core_.slots->queued(c->stall_slot);
      if (queued < c->stall_queued) {  // progress: keep waiting
        c->stall_queued = queued;
        c->stalled_until = now + patience;
      }
      if (now < c->stalled_until && queued > low) return false;
      c->stalled = false;
      resume_reading(*c);
      touch(*c);
      return true;
    });
    flush_touched();
  }
  if (!handshakes_.empty()) check_handshake_deadlines();
  if (!unauthenticated_.empty()) check_auth_deadlines();
  if (closing_.empty()) return;
  std::vector<std::uint64_t> ids;
  ids.swap(closing_);
  for (std::uint64_t id : ids) {
    Connection* c = find(id);
    if (c == nullptr || c->reaping) continue;
    if (now >= c->deadline) {
      if (c->state == ConnState::kDraining) {
        disconnect(*c);  // re-registers it in closing_
        continue;
      }
      try_finish(*c);
    }
    if (!c->reaping && (c->state == ConnState::kDraining || c->state == ConnState::kDisconnecting)) {
      closing_.push_back(id);
    }
  }
  // disconnect() above may have appended duplicates; they are harmless.
}

}  // namespace rdmabroker::daemon
