// SPDX-License-Identifier: Apache-2.0
// Worker: the event loop, its resources, and CM events. Commands are in
// worker/commands.cpp; everything above the transports in connection/,
// router/ and frames/.
#include "worker/worker.hpp"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker::daemon {

Worker::Worker(std::uint32_t index, BrokerCore& core)
    : ctx_(index, core),
      blocks_(core.options.send_blocks),
      connections_(ctx_, blocks_),
      router_(ctx_, connections_),
      frames_(ctx_, connections_, router_) {}

Worker::~Worker() { join(); }

Status Worker::init(const DeviceSet* devices, TcpListeners tcp) {
  auto sys_error = [](const std::string& what) {
    return Error{ErrorKind::kResource, what + ": " + std::strerror(errno)};
  };
  router_.set_worker_count(ctx_.core.options.workers);
  if (!commands_.valid()) return sys_error("eventfd");
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return sys_error("epoll_create1");
  auto watch = [&](int fd, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
  };
  if (!watch(commands_.fd(), kTagCommands)) return sys_error("epoll_ctl");
  if (devices != nullptr) {  // RDMA enabled
    cm_channel_.reset(rdma_create_event_channel());
    if (!cm_channel_) return sys_error("rdma_create_event_channel");
    if (!set_nonblocking(cm_channel_->fd)) return sys_error("O_NONBLOCK on the CM channel");
    if (!watch(cm_channel_->fd, kTagCm)) return sys_error("epoll_ctl");
    const std::uint32_t per_worker_conns = ctx_.options.max_connections / ctx_.core.options.workers + 1;
    for (const auto& dev : devices->devices()) {
      auto port = RdmaPort::create(*dev, ctx_, connections_, frames_, blocks_, per_worker_conns, epoll_.get(),
                                   EpollTags(static_cast<std::uint32_t>(ports_.size())));
      if (!port) return port.error();
      rdma_ports_.push_back(port.value().get());
      ports_.push_back(std::move(port.value()));
    }
  }
  if (tcp.any()) {
    auto port = TcpPort::create(ctx_, connections_, frames_, epoll_.get(),
                                EpollTags(static_cast<std::uint32_t>(ports_.size())), tcp);
    if (!port) return port.error();
    tcp_port_ = port.value().get();
    ports_.push_back(std::move(port.value()));
  }
  epoll_only_ports_ = any_port([](const Port& p) { return p.seen_only_by_epoll(); });
  for (auto* port : rdma_ports_) port->refill(connections_);
  if (cm_channel_)
    dialer_ = std::make_unique<RdmaDialer>(ctx_, connections_, frames_, cm_channel_.get(), rdma_ports_);
  return {};
}

void Worker::start() {
  thread_ = std::thread([this] {
    name_this_thread("rb-worker-" + std::to_string(index()));
    run();
  });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::run() {
  turn_held_.lock();
  ctx_.bind_to_this_thread();
  while (true) {
    ctx_.now = std::chrono::steady_clock::now();
    heartbeat_.store(ctx_.now.time_since_epoch().count(), std::memory_order_relaxed);
    handle_commands();
    handle_cm_events();
    if constexpr (fault::kEnabled) {
      if (!delayed_cm_.empty()) deliver_delayed_cm_events();
      if (const auto ms = ctx_.core.faults.worker_stall_ms.exchange(0, std::memory_order_relaxed); ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
    }
    bool busy = poll_ports();
    if (busy) {
      last_work_ = ctx_.now;
    } else if (ctx_.options.adaptive_poll) {
      busy = adaptive_spin();
    } else if (ctx_.options.busy_poll_us > 0) {
      busy = spin_poll(last_work_ + std::chrono::microseconds(ctx_.options.busy_poll_us));
    }
    router_.post_batches();
    connections_.flush_touched();
    for (auto& port : ports_) port->after_flush();
    connections_.check_deadlines();
    for (auto& port : ports_) port->check_deadlines(stopping_);
    check_routes();
    connections_.reap();
    if (stopping_ && connections_.empty() && !any_port([](const Port& p) { return p.accepting(); })) break;
    // Stalled publishers and closing connections need timely deadline checks.
    if (!busy) {
      wait_events(connections_.needs_prompt_check() ? 1 : stopping_ ? 50 : 200);
    } else if (any_port([](const Port& p) { return p.wants_events_every_turn(); }) ||
               ctx_.now >= next_socket_check_) {
      // While completions keep the loop busy, sockets are still looked at:
      // every turn when this worker has TCP connections, else every
      // millisecond (for the listening socket). A pure-RDMA load pays no
      // extra system call per turn.
      next_socket_check_ = ctx_.now + std::chrono::milliseconds(1);
      wait_events(0);
    }
  }
  spdlog::debug("worker {}: stopped", ctx_.index);
  turn_held_.unlock();
}

bool Worker::deliver_if_asleep(std::vector<RemoteDelivery>& items) {
  std::unique_lock turn(turn_, std::try_to_lock);
  // Awake, or a command waits that these deliveries must not overtake (an
  // earlier DeliverCommand of the same publisher): the queue it is.
  if (!turn.owns_lock() || !asleep_ || commands_.pending()) return false;
  ctx_.bind_to_this_thread();
  ctx_.now = std::chrono::steady_clock::now();
  ctx_.stats.handoffs_direct.add();
  deliver(items);
  connections_.flush_touched();
  // The sends of earlier deliveries completed into a send CQ that woke
  // nobody: reap them here (their buffers go back to the pool, windows open).
  bool reaped = false;
  for (auto& port : ports_) reaped |= port->reap_sends();
  if (reaped) connections_.flush_touched();
  // What cannot wait for the worker's next timeout (a connection that waits
  // on a send, one that closed, a stalled publisher) wakes it after all.
  if (connections_.sends_awaited() || connections_.needs_prompt_check()) commands_.wake();
  return true;
}

bool Worker::poll_ports() {
  bool busy = false;
  for (auto& port : ports_) busy |= port->poll();
  return busy;
}

bool Worker::spin_poll(std::chrono::steady_clock::time_point until) {
  // Busy polling: until then, a completion is picked up as it lands instead
  // of after a wake-up through the completion channel, at the price of a
  // core. The CQs are polled every turn (no system call); every 64th turn,
  // the command queue and, on a worker with TCP, the epoll set (level
  // triggered: a peek consumes nothing), so that a TCP client's frame waits
  // for at most 64 turns of a spin, not for its end. CM events are looked
  // at when the spin ends or finds work.
  // ctx_.now follows the spin, for its bound and for what reads the loop
  // time after it (RdmaPort::drain stamps what a poll finds itself).
  ctx_.now = std::chrono::steady_clock::now();
  if (ctx_.now >= until) return false;
  for (int i = 0; ctx_.now < until; ++i) {
    if (poll_ports() || ((i & 63) == 63 && (commands_.pending() || (epoll_only_ports_ && sockets_ready())))) {
      ctx_.now = std::chrono::steady_clock::now();
      last_work_ = ctx_.now;
      ctx_.stats.spins_found.add();
      return true;
    }
    ctx_.now = std::chrono::steady_clock::now();
  }
  ctx_.stats.spins_empty.add();
  return false;
}

bool Worker::sockets_ready() {
  epoll_event events[8];
  const int n = ::epoll_wait(epoll_.get(), events, 8, 0);
  bool ready = false;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tag = events[i].data.u64;
    const int port = EpollTags::port_of(tag);
    // A completion channel's event left from before the spin is taken by
    // its port, or it would look like work every 64 turns until the next
    // wait; a socket, a command or a CM event is the loop's to handle.
    if (port < 0 || ports_[static_cast<std::size_t>(port)]->ready_in_spin(EpollTags::payload_of(tag)))
      ready = true;
  }
  return ready;
}

bool Worker::adaptive_spin() {
  // flow.adaptive_poll: the window follows the last sleeps (AdaptiveSpin);
  // wait_events() tells it how long each one lasted from here.
  const auto until = adaptive_.ran_out(ctx_.now, std::chrono::microseconds(ctx_.options.busy_poll_us));
  if (until <= ctx_.now || !ctx_.core.spin_slots.try_take()) return false;
  const bool found = spin_poll(until);
  ctx_.core.spin_slots.release();
  return found;
}

void Worker::wait_events(int timeout_ms) {
  if (timeout_ms > 0) {
    // Arm the CQs, then poll once more: a completion that arrived between
    // the last empty poll and the arm raises no event, and would otherwise
    // sit in the CQ until something else woke us. Send CQs only if a send
    // completion is awaited: else a delivery's completion would wake us.
    const bool sends_awaited = connections_.sends_awaited();
    for (auto& port : ports_) port->arm(sends_awaited);
    if (poll_ports()) timeout_ms = 0;
  }
  epoll_event events[64];
  int n;
  if (timeout_ms == 0) {
    n = ::epoll_wait(epoll_.get(), events, 64, 0);
  } else {
    // Asleep: the turn is free for a thread with deliveries for us.
    asleep_ = true;
    turn_held_.unlock();
    n = ::epoll_wait(epoll_.get(), events, 64, timeout_ms);
    turn_held_.lock();
    asleep_ = false;
    ctx_.bind_to_this_thread();
  }
  ctx_.now = std::chrono::steady_clock::now();
  if (timeout_ms != 0 && ctx_.options.adaptive_poll) adaptive_.woke(ctx_.now);
  if (timeout_ms != 0) count_wakeup(events, n);
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tag = events[i].data.u64;
    const int port = EpollTags::port_of(tag);
    if (port < 0) continue;  // a command or a CM event: handled at the top of the loop
    ports_[static_cast<std::size_t>(port)]->on_event(EpollTags::payload_of(tag), events[i].events, stopping_);
  }
}

void Worker::count_wakeup(const epoll_event* events, int n) {
  // One wake-up per blocking wait, put down to the most telling event: a
  // completion (the data path), then a command (a hand-off from another
  // thread), a socket, a CM event; none at all is the timer.
  WakeCause cause = WakeCause::kTimer;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tag = events[i].data.u64;
    const int port = EpollTags::port_of(tag);
    WakeCause c = WakeCause::kCompletion;
    if (tag == kTagCommands) {
      c = WakeCause::kCommand;
    } else if (tag == kTagCm) {
      c = WakeCause::kCm;
    } else if (port >= 0 && ports_[static_cast<std::size_t>(port)]->kind_of(EpollTags::payload_of(tag)) ==
                                PortEvent::kSocket) {
      c = WakeCause::kSocket;
    }
    cause = std::min(cause, c);
  }
  ctx_.stats.wakeups[static_cast<std::size_t>(cause)].add();
}

void Worker::handle_cm_events() {
  if (!cm_channel_) return;  // TCP only
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(cm_channel_.get(), &raw) == 0) {
    if (dialer_->on_cm_event(raw)) continue;  // a route being dialed (acked there)
    // Copy what we need and ack at once: rdma_destroy_id waits for acks.
    const rdma_cm_event_type type = raw->event;
    const int status = raw->status;
    const auto conn_id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(raw->id->context));
    rdma_ack_cm_event(raw);
    if constexpr (fault::kEnabled) {
      auto& faults = ctx_.core.faults;
      if (fault::Shared::take(faults.cm_delays)) {
        const auto delay = std::chrono::milliseconds(faults.cm_delay_ms.load(std::memory_order_relaxed));
        spdlog::info("fault: {} of connection {} held back {} ms", rdma_event_str(type), conn_id,
                     delay.count());
        delayed_cm_.push_back({ctx_.now + delay, type, status, conn_id});
        continue;
      }
      if (fault::Shared::take(faults.cm_duplicates)) {
        spdlog::info("fault: {} of connection {} handled twice", rdma_event_str(type), conn_id);
        on_cm_event(type, status, conn_id);
      }
    }
    on_cm_event(type, status, conn_id);
  }
}

void Worker::on_cm_event(rdma_cm_event_type type, int status, std::uint64_t conn_id) {
  Connection* c = connections_.find(conn_id);
  if (c == nullptr) {
    spdlog::debug("worker {}: {} for connection {} that is gone", ctx_.index, rdma_event_str(type), conn_id);
    return;
  }
  switch (type) {
    case RDMA_CM_EVENT_ESTABLISHED:
      connections_.establish(*c);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      // A route this broker dialed learns why from what its broker sent
      // before (a refused login: ERROR, then CLOSE): taken first.
      if (c->dialed && c->is_up()) poll_ports();
      connections_.peer_gone(*c,
                             c->close_received ? CloseReason::kClientClose : CloseReason::kPeerDisconnected);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      c->peer_disconnected = true;
      connections_.close(*c, CloseReason::kDeviceRemoved);
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
      log_throttled(ctx_.core.cm_error_log, spdlog::level::warn, "connection {} from {}: {} (status {})",
                    c->id, c->peer, rdma_event_str(type), status);
      c->peer_disconnected = true;
      connections_.close(*c, CloseReason::kConnectFailed);
      break;
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      break;
    default:
      spdlog::debug("connection {}: CM event {}", c->id, rdma_event_str(type));
      break;
  }
}

void Worker::deliver_delayed_cm_events() {
  std::vector<DelayedCmEvent> due;
  std::erase_if(delayed_cm_, [&](const DelayedCmEvent& e) {
    if (e.due > ctx_.now) return false;
    due.push_back(e);
    return true;
  });
  for (const auto& e : due) {
    spdlog::info("fault: {} of connection {} handled now, late", rdma_event_str(e.type), e.conn_id);
    on_cm_event(e.type, e.status, e.conn_id);
  }
}

}  // namespace rdmabroker::daemon
