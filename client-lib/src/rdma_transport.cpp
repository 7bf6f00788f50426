// SPDX-License-Identifier: Apache-2.0
// The RDMA transport of a Session: connect and the I/O thread
// (rdma_transport.hpp says how it works; sending is in rdma_sends.cpp,
// multicast in rdma_multicast.cpp).
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "rdma_transport.hpp"
#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker {

// ---------------------------------------------------------------- connect

Result<rdma_cm_event_type> RdmaTransport::wait_cm_event(rdma_cm_event_type expected,
                                                        Clock::time_point deadline,
                                                        std::vector<std::byte>* private_data) {
  while (true) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(cm_channel_.get(), &ev) == 0) {
      verbs::CmEventPtr owned(ev);
      if (private_data != nullptr && ev->param.conn.private_data != nullptr) {
        auto* p = static_cast<const std::byte*>(ev->param.conn.private_data);
        private_data->assign(p, p + ev->param.conn.private_data_len);
      }
      if (ev->event != expected && ev->event != RDMA_CM_EVENT_REJECTED && ev->status != 0) {
        return Error{ErrorKind::kConnectFailed, std::string(rdma_event_str(ev->event)) + " (status " +
                                                    std::to_string(ev->status) + ": " +
                                                    std::strerror(std::abs(ev->status)) + ")"};
      }
      return ev->event;
    }
    if (errno != EAGAIN) return sys_error(ErrorKind::kConnectFailed, "rdma_get_cm_event");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      return Error{ErrorKind::kTimeout, "timed out waiting for " + std::string(rdma_event_str(expected))};
    pollfd p{cm_channel_->fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left));
  }
}

Status RdmaTransport::connect() {
#if RDMABROKER_FAULT_INJECTION
  fail_joins_ = std::getenv("RDMABROKER_TEST_FAIL_MCAST_JOIN") != nullptr;
#endif
  const Status st = session_.connect_with_retry(
      [this](std::uint32_t size, proto::ConnectReject* reject) { return connect_once(size, reject); },
      [this] { teardown_resources(); });
  if (!st) return st;
  if (!session_.options().polled) {
    io_thread_ = std::thread([this] {
      name_this_thread("rb-client-io");
      run();
    });
  }
  return session_.authenticate();
}

Status RdmaTransport::connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject) {
  const auto deadline = Clock::now() + session_.options().connect_timeout;
  const std::string where = url_.host + ":" + std::to_string(url_.port);
  recv_buffer_size_ = recv_buffer_size;
  cm_channel_.reset(rdma_create_event_channel());
  if (!cm_channel_ && (errno == ENODEV || errno == ENOENT)) {
    // The first thing most new users run, on a laptop or a VM: say what to do.
    return Error{ErrorKind::kConnectFailed,
                 "no RDMA device on this host (rdma_cm: " + std::string(std::strerror(errno)) +
                     "): " + url_.scheme + "://" + where +
                     " needs one; connect over TCP instead (tcp://HOST:7471: the CLI's -s, RDMABROKER_URL)"};
  }
  if (!cm_channel_) return sys_error(ErrorKind::kResource, "rdma_create_event_channel");
  set_nonblocking(cm_channel_->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(cm_channel_.get(), &id, nullptr, RDMA_PS_TCP) != 0)
    return sys_error(ErrorKind::kResource, "rdma_create_id");
  id_.reset(id);
  if (auto st = resolve(where, deadline); !st) return st;
  if (auto st = create_resources(recv_buffer_size); !st) return st;
  auto accept = exchange_handshake(recv_buffer_size, where, deadline, reject);
  if (!accept) return accept.error();
  return start_session(*accept, where);
}

Status RdmaTransport::resolve(const std::string& where, Clock::time_point deadline) {
  rdma_cm_id* id = id_.get();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* dst = nullptr;
  if (int rc = getaddrinfo(url_.host.c_str(), std::to_string(url_.port).c_str(), &hints, &dst); rc != 0) {
    return Error{ErrorKind::kInvalidArgument, "cannot resolve " + url_.host + ": " + gai_strerror(rc)};
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> dst_owner(dst, freeaddrinfo);
  addrinfo* src = nullptr;
  if (!session_.options().bind_address.empty()) {
    if (int rc = getaddrinfo(session_.options().bind_address.c_str(), nullptr, &hints, &src); rc != 0) {
      return Error{ErrorKind::kInvalidArgument,
                   "bad bind address " + session_.options().bind_address + ": " + gai_strerror(rc)};
    }
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> src_owner(src, freeaddrinfo);
  // rdma_cm timeouts stay generous: under emulation or contention a resolve
  // can take seconds.
  if (rdma_resolve_addr(id, src != nullptr ? src->ai_addr : nullptr, dst->ai_addr, 2000) != 0) {
    return sys_error(ErrorKind::kConnectFailed, "rdma_resolve_addr(" + where + ")");
  }
  if (auto ev = wait_cm_event(RDMA_CM_EVENT_ADDR_RESOLVED, deadline, nullptr);
      !ev || *ev != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return Error{ErrorKind::kConnectFailed, "resolving " + where + ": " +
                                                (ev ? std::string(rdma_event_str(*ev)) : ev.error().message) +
                                                " (is an RDMA device up with a route to it?)"};
  }
  if (rdma_resolve_route(id, 2000) != 0)
    return sys_error(ErrorKind::kConnectFailed, "rdma_resolve_route(" + where + ")");
  if (auto ev = wait_cm_event(RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, nullptr);
      !ev || *ev != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return Error{ErrorKind::kConnectFailed,
                 "route to " + where + ": " + (ev ? std::string(rdma_event_str(*ev)) : ev.error().message)};
  }
  return {};
}

Status RdmaTransport::create_resources(std::uint32_t recv_buffer_size) {
  // Resources on the device the route chose.
  rdma_cm_id* id = id_.get();
  pd_.reset(ibv_alloc_pd(id->verbs));
  if (!pd_) return sys_error(ErrorKind::kResource, "ibv_alloc_pd");
  comp_channel_.reset(ibv_create_comp_channel(id->verbs));
  if (!comp_channel_) return sys_error(ErrorKind::kResource, "ibv_create_comp_channel");
  set_nonblocking(comp_channel_->fd);
  cq_.reset(ibv_create_cq(id->verbs, static_cast<int>(session_.options().recv_credits + 1), nullptr,
                          comp_channel_.get(), 0));
  send_cq_.reset(ibv_create_cq(id->verbs, static_cast<int>(session_.options().max_inflight_sends + 2),
                               nullptr, comp_channel_.get(), 0));
  if (!cq_ || !send_cq_) return sys_error(ErrorKind::kResource, "ibv_create_cq");
  acker_.attach(cq_.get());
  send_acker_.attach(send_cq_.get());
  ibv_qp_init_attr attr{};
  attr.send_cq = send_cq_.get();
  attr.recv_cq = cq_.get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = session_.options().max_inflight_sends + 1;
  attr.cap.max_recv_wr = session_.options().recv_credits;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = verbs::kInlineWanted;
  if (rdma_create_qp(id, pd_.get(), &attr) != 0) {
    attr.cap.max_inline_data = 0;  // a device that cannot inline
    if (rdma_create_qp(id, pd_.get(), &attr) != 0) return sys_error(ErrorKind::kResource, "rdma_create_qp");
  }
  qp_ = verbs::CmQp(id);
  max_inline_ = attr.cap.max_inline_data;

  const std::size_t recv_bytes = std::size_t{session_.options().recv_credits} * recv_buffer_size;
  recv_mem_.reset(new std::byte[recv_bytes]);
  recv_mr_ = verbs::register_local(pd_.get(), recv_mem_.get(), recv_bytes);
  if (!recv_mr_) return sys_error(ErrorKind::kResource, "ibv_reg_mr (receive buffers; check ulimit -l)");
  for (std::uint32_t i = 0; i < session_.options().recv_credits; ++i) {
    if (!verbs::post_receive(qp_.get(), recv_mem_.get() + std::size_t{i} * recv_buffer_size, recv_buffer_size,
                             recv_mr_->lkey, kRecvFlag | i)) {
      return sys_error(ErrorKind::kResource, "ibv_post_recv");
    }
  }
  return {};
}

Result<proto::ConnectAccept> RdmaTransport::exchange_handshake(std::uint32_t recv_buffer_size,
                                                               const std::string& where,
                                                               Clock::time_point deadline,
                                                               proto::ConnectReject* reject) {
  auto pdata = proto::encode(proto::ConnectRequest{
      recv_buffer_size, session_.options().recv_credits,
      static_cast<std::uint16_t>((session_.options().multicast ? proto::kConnectMulticast : 0) |
                                 (session_.options().rendezvous ? proto::kConnectLanding : 0))});
  rdma_conn_param param{};
  param.private_data = pdata.data();
  param.private_data_len = static_cast<std::uint8_t>(pdata.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // safety net only: credits keep a receive posted
  // Version 8: the broker may READ what we offer (SPEC.md §3.8), two READs
  // at a time; it READs nothing else (only offered regions have an rkey).
  param.responder_resources = session_.options().rendezvous ? 2 : 0;
  if (rdma_connect(id_.get(), &param) != 0)
    return sys_error(ErrorKind::kConnectFailed, "rdma_connect(" + where + ")");
  std::vector<std::byte> reply;
  auto ev = wait_cm_event(RDMA_CM_EVENT_ESTABLISHED, deadline, &reply);
  if (!ev) return ev.error();
  if (*ev == RDMA_CM_EVENT_REJECTED) {
    if (proto::decode(reply, *reject) == proto::HandshakeStatus::kOk) return connect_rejected(where, *reject);
    return Error{ErrorKind::kRejected,
                 "connection to " + where + " rejected (no rdmabroker listening there?)"};
  }
  if (*ev != RDMA_CM_EVENT_ESTABLISHED) {
    return Error{ErrorKind::kConnectFailed, "connecting to " + where + ": " + rdma_event_str(*ev)};
  }
  proto::ConnectAccept accept;
  if (auto st = proto::decode(reply, accept); st != proto::HandshakeStatus::kOk) {
    return Error{ErrorKind::kConnectFailed,
                 "bad accept from " + where + ": " + std::string(proto::to_string(st))};
  }
  return accept;
}

Status RdmaTransport::start_session(const proto::ConnectAccept& accept, const std::string& where) {
  protocol_version_ = accept.version;
  proto::ConnectAccept agreed = accept;
  if (agreed.rendezvous_min != 0) {
    // rdma_cm gave the QP no remote access (no responder resources when it
    // moved it to INIT): READ, which only an offered region's rkey opens, is
    // allowed now, and from version 9 WRITE, which only a landing area's
    // opens. A broker that waits for our answers (LANDING, SPEC.md §3.9)
    // must not wait on a QP that cannot take WRITEs: that fails the connection.
    if (!session_.options().rendezvous) {
      agreed.rendezvous_min = 0;
    } else if (!verbs::allow_remote_access(qp_.get(), accept.version >= proto::kLandingVersion)) {
      return sys_error(ErrorKind::kResource, "ibv_modify_qp (remote access for rendezvous)");
    }
  }
  session_.init_send_buffers(agreed,
                             session_.options().max_inflight_sends + session_.options().send_queue_buffers);
  send_mr_ = verbs::register_local(pd_.get(), session_.send_memory().data(), session_.send_memory().size());
  if (!send_mr_) return sys_error(ErrorKind::kResource, "ibv_reg_mr (send buffers; check ulimit -l)");

  credits_ = CreditWindow(session_.options().recv_credits);
  credits_.grant_initial(session_.options().recv_credits);
  credits_.add_send_credits(accept.initial_credits);

  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!wake_fd_ || !epoll_) return sys_error(ErrorKind::kResource, "eventfd/epoll");
  for (int fd : {comp_channel_->fd, cm_channel_->fd, wake_fd_.get()}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e);
  }
  ibv_req_notify_cq(cq_.get(), 0);
  recv_cq_armed_ = true;

  char local[INET6_ADDRSTRLEN] = "?";
  auto* sa = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(id_.get()));
  inet_ntop(AF_INET, &sa->sin_addr, local, sizeof local);
  session_.established("rdma " + std::string(ibv_get_device_name(id_->verbs->device)) + " " + local + " -> " +
                       where + " (connection " + std::to_string(accept.connection_id) + ")");
  return {};
}

void RdmaTransport::teardown_resources() {
  teardown_ud();  // its QP and MR use the PD
  // Reverse order of creation: QP, MRs, CQ, completion channel, PD, cm_id, channel.
  qp_.reset();
  exposed_.clear();   // the offered messages' MRs, before the PD
  landings_.clear();  // and the landing areas'
  send_mr_.reset();
  recv_mr_.reset();
  acker_.flush();
  send_acker_.flush();
  send_cq_.reset();
  cq_.reset();
  comp_channel_.reset();
  pd_.reset();
  id_.reset();
  cm_channel_.reset();
  inflight_.clear();
  send_cq_armed_ = false;
  recv_cq_armed_ = false;
  send_errors_.clear();
}

void RdmaTransport::close() {
  if (!session_.begin_close()) return;
  rdma_disconnect(id_.get());
  wake();
  if (io_thread_.joinable()) io_thread_.join();
  session_.ended();
  teardown_resources();
}

// ---------------------------------------------------------------- I/O thread

void RdmaTransport::run() {
  // Everything that needs this thread raises an fd event (completions, CM
  // events, close()'s wake-up), so an idle client sleeps until one comes; a
  // 100 ms tick made a process holding 1,000 idle clients wake 10,000 times
  // a second for nothing.
  while (!session_.stop_requested()) progress(-1);
}

std::size_t RdmaTransport::progress(int timeout_ms) {
  if (timeout_ms != 0 &&
      (session_.options().adaptive_poll
           ? adaptive_spin()
           : session_.options().busy_poll.count() > 0 &&
                 spin_on_cq(last_work_ + session_.options().busy_poll, deliveries_, errors_))) {
    last_work_ = Clock::now();
    timeout_ms = 0;  // found work: the events are only looked at, not waited for
  }
  // A multicast gap to ask for (or a frame to retry) bounds the sleep.
  if (const int gap_ms = session_.check_gaps(); gap_ms >= 0)
    timeout_ms = timeout_ms < 0 ? gap_ms : std::min(timeout_ms, gap_ms);
  // Completions go first: a CLOSE frame from the broker completes here before
  // its DISCONNECTED event, and it says why the connection ends.
  bool found = poll_receives();
  if (!found && timeout_ms != 0 && !recv_cq_armed_) {
    // About to sleep: arm the CQ (a system call on some devices, so not on
    // every turn), then look once more, since a completion between the poll
    // and the arming raises no event.
    ibv_req_notify_cq(cq_.get(), 0);
    recv_cq_armed_ = true;
    found = poll_receives();
  }
  if (found) timeout_ms = 0;
  // The fds (CM events, wake-ups, multicast joins) when this turn may sleep;
  // a turn that must not (work found, or a polled client spinning on
  // poll(0)) looks at them every 16th time only: it costs a system call.
  bool cm_ready = false;
  if (timeout_ms != 0 || (++quick_turns_ & 15) == 0) {
    cm_ready = wait_for_events(timeout_ms);
    if (timeout_ms != 0 && session_.options().adaptive_poll) adaptive_.woke(Clock::now());
    // What arrived meanwhile, before a CM event is acted on (the broker's
    // CLOSE comes before its DISCONNECTED).
    if (timeout_ms != 0 || cm_ready) poll_receives();
  }
  if (ud_) drain_ud(deliveries_);
  if (cm_ready) handle_cm_events(errors_);
  // The handlers see in place what the held receive buffers hold; then the
  // buffers go back to the broker, and the credits they owe with what is sent.
  std::size_t delivered = session_.dispatch(deliveries_, errors_);
  {
    const auto lock = session_.lock();
    repost_held_locked();
    transmit_locked();
    errors_.insert(errors_.end(), send_errors_.begin(), send_errors_.end());
    send_errors_.clear();
  }
  if (!errors_.empty()) delivered += session_.dispatch(deliveries_, errors_);
  return delivered;
}

bool RdmaTransport::poll_receives() {
  // The receive CQ only: sends are reaped under the lock (transmit_locked).
  // Bounded: a receive stays held (not posted again) until this turn's
  // dispatch, so at most recv_credits complete.
  ibv_wc wcs[32];
  bool any = false;
  int got;
  while ((got = ibv_poll_cq(cq_.get(), 32, wcs)) > 0) {
    for (int i = 0; i < got; ++i) on_completion(wcs[i], deliveries_, errors_);
    any = true;
  }
  if (any) last_work_ = Clock::now();
  return any;
}

void RdmaTransport::progress_sends() {
  const auto lock = session_.lock();
  transmit_locked();  // reaps the send CQ first
}

bool RdmaTransport::adaptive_spin() {
  // The spin slots of the process: however many clients it holds, no more
  // of their I/O threads spin at once than it has cores but one.
  static SpinSlots slots;
  const auto now = Clock::now();
  const auto until = adaptive_.ran_out(now, session_.options().busy_poll);
  if (until <= now || !slots.try_take()) return false;
  const bool found = spin_on_cq(until, deliveries_, errors_);
  slots.release();
  return found;
}

bool RdmaTransport::spin_on_cq(Clock::time_point until, Deliveries& deliveries, std::vector<Error>& errors) {
  // Spin on the CQ (no system call) until a completion lands or `until`;
  // what it finds is handled at once.
  ibv_wc wcs[32];
  int got = 0;
  for (int i = 0; got == 0 && Clock::now() < until; ++i) {
    got = ibv_poll_cq(cq_.get(), 32, wcs);
    if ((i & 1023) == 1023 && session_.stop_requested()) break;
  }
  for (int i = 0; i < got; ++i) on_completion(wcs[i], deliveries, errors);
  return got > 0;
}

bool RdmaTransport::wait_for_events(int timeout_ms) {
  epoll_event evs[6];
  const int n = ::epoll_wait(epoll_.get(), evs, 6, timeout_ms);
  if (timeout_ms != 0) count_wakeup();
  bool cm_ready = false;
  for (int i = 0; i < n; ++i) {
    const int fd = evs[i].data.fd;
    if (fd == comp_channel_->fd) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      while (ibv_get_cq_event(comp_channel_.get(), &cq, &ctx) == 0) {
        if (cq == send_cq_.get()) {
          send_acker_.add();
          const auto lock = session_.lock();
          send_cq_armed_ = false;  // one event per arming
        } else {
          acker_.add();
          recv_cq_armed_ = false;  // one event per arming
        }
      }
    } else if (fd == cm_channel_->fd) {
      cm_ready = true;
    } else if (ud_ && fd == ud_->channel->fd) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      while (ibv_get_cq_event(ud_->channel.get(), &cq, &ctx) == 0) ud_->acker.add();
    } else if (ud_cm_channel_ && fd == ud_cm_channel_->fd) {
      handle_group_events();
    } else {
      take_wakeups();
    }
  }
  return cm_ready;
}

void RdmaTransport::handle_cm_events(std::vector<Error>& errors) {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(cm_channel_.get(), &ev) == 0) {
    verbs::CmEventPtr owned(ev);
    if (ev->event == RDMA_CM_EVENT_DISCONNECTED || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      const auto lock = session_.lock();
      if (!session_.closed_locked() && !session_.closing_locked())
        errors.push_back(Error{ErrorKind::kClosed, "connection to the broker lost"});
      session_.fail_locked(Error{ErrorKind::kClosed, "connection to the broker lost (" +
                                                         std::string(rdma_event_str(ev->event)) + ")"});
    }
  }
}

void RdmaTransport::on_completion(const ibv_wc& wc, Deliveries& deliveries, std::vector<Error>& errors) {
  if (wc.status != IBV_WC_SUCCESS) {
    const auto lock = session_.lock();
    if (!session_.closed_locked() && wc.status != IBV_WC_WR_FLUSH_ERR) {
      errors.push_back(
          Error{ErrorKind::kClosed, std::string("receive failed: ") + ibv_wc_status_str(wc.status)});
    }
    session_.fail_locked(
        Error{ErrorKind::kClosed, std::string("receive failed: ") + ibv_wc_status_str(wc.status)});
    return;
  }
  session_.on_frames({recv_buf(wc.wr_id), wc.byte_len}, deliveries, errors);
  held_.push_back(wc.wr_id);
  if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    const auto lock = session_.lock();
    if (session_.closed_locked()) return;
    const std::uint32_t imm = ntohl(wc.imm_data);
    if (by_demand()) {
      const auto [returned, release] = proto::decode_credit_imm(imm);
      credits_.add_send_credits(returned);
      if (release > 0) credits_.on_release_request(release);
    } else {
      credits_.add_send_credits(imm);
    }
  }
}

void RdmaTransport::repost_held_locked() {
  for (const std::uint64_t wr_id : held_) {
    if (session_.closed_locked()) break;
    if (!verbs::post_receive(qp_.get(), recv_buf(wr_id), recv_buffer_size_, recv_mr_->lkey, wr_id)) {
      session_.fail_locked(sys_error(ErrorKind::kClosed, "ibv_post_recv"));
      break;
    }
    if (!credits_.on_receive()) {
      session_.fail_locked(Error{ErrorKind::kClosed, "broker sent without a credit (protocol violation)"});
      break;
    }
  }
  held_.clear();
}

// ---------------------------------------------------------------- multicast

std::unique_ptr<Transport> make_rdma_transport(SessionSide& session, const ParsedUrl& url) {
  return std::make_unique<RdmaTransport>(session, url);
}

}  // namespace rdmabroker
