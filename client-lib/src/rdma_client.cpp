// The RDMA implementation of rdmabroker::Client.
//
// One RC QP per client with its own CQ and receive queue. Publishes are
// encoded straight into registered send buffers: the buffer being filled is
// posted at once when the connection is idle, and otherwise keeps collecting
// frames until a send completes (coalescing; SPEC.md "Batching"). Credits
// follow the same rules as the broker (common/credits.hpp).
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "client_internal.hpp"
#include "rdmabroker/common/credits.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker {
namespace {

using proto::FrameType;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kRecvFlag = 1ull << 63;
constexpr std::uint32_t kNoBuffer = ~0u;

Error sys_error(ErrorKind kind, const std::string& what) { return Error{kind, what + ": " + std::strerror(errno)}; }

/// Blocking subscription queue, filled by the I/O thread.
class QueueSubscription final : public Subscription {
 public:
  QueueSubscription(std::uint32_t sid, std::size_t limit) : Subscription(sid), limit_(limit) {}

  Result<Message> next(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
    if (!queue_.empty()) {
      Message m = std::move(queue_.front());
      queue_.pop_front();
      return m;
    }
    if (closed_) return Error{ErrorKind::kClosed, closed_why_};
    return Error{ErrorKind::kTimeout, "no message within " + std::to_string(timeout.count()) + " ms"};
  }
  std::uint64_t dropped() const override { return dropped_.load(); }

  /// Returns false when the message was dropped (queue limit).
  bool push(Message m) {
    {
      std::lock_guard lock(mu_);
      if (queue_.size() >= limit_) {
        dropped_.fetch_add(1);
        return false;
      }
      queue_.push_back(std::move(m));
    }
    cv_.notify_one();
    return true;
  }
  void close(const std::string& why) {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
      closed_why_ = why;
    }
    cv_.notify_all();
  }

 private:
  const std::size_t limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
  bool closed_ = false;
  std::string closed_why_;
  std::atomic<std::uint64_t> dropped_{0};
};

struct SubscriptionEntry {
  std::string subject;
  MessageHandler handler;                       // or
  std::shared_ptr<QueueSubscription> queue;     // one of the two
};

class RdmaClient final : public Client {
 public:
  RdmaClient(ParsedUrl url, ClientOptions options) : url_(std::move(url)), opt_(std::move(options)) {}
  ~RdmaClient() override { close(); }

  Status connect();

  Status publish(std::string_view subject, std::span<const std::byte> payload) override;
  Result<std::uint32_t> subscribe(std::string_view subject, MessageHandler handler) override;
  Result<std::shared_ptr<Subscription>> subscribe(std::string_view subject) override;
  Status unsubscribe(std::uint32_t sid) override;
  Status flush(std::chrono::milliseconds timeout) override;
  void close() override;
  std::size_t max_payload(std::size_t subject_len) const override {
    return proto::max_payload(proto::max_publish_frame(max_frame_), subject_len);
  }
  std::string transport_description() const override { return description_; }
  Error close_reason() const override {
    std::lock_guard lock(mu_);
    return closed_ ? close_error_ : Error{ErrorKind::kClosed, ""};
  }

 private:
  Status connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject);
  Result<rdma_cm_event_type> wait_cm_event(rdma_cm_event_type expected, Clock::time_point deadline,
                                           std::vector<std::byte>* private_data);
  void teardown_resources();
  void run();

  // All of these run with mu_ held.
  Status append_frame_locked(std::unique_lock<std::mutex>& lock, const proto::FrameHeader& h, std::string_view subject,
                             std::span<const std::byte> payload);
  void try_post_locked();
  bool post_locked(std::uint32_t buffer, std::uint32_t len);
  void fail_locked(Error why);
  static Status check_subject(std::string_view subject, bool pattern = false) {
    if (pattern ? proto::valid_pattern(subject) : proto::valid_subject(subject)) return {};
    return Error{ErrorKind::kInvalidArgument, "invalid subject '" + std::string(subject) + "'" +
                                                  (pattern ? "" : " (wildcards only in subscriptions)") +
                                                  " (see docs/subjects.md)"};
  }
  Result<std::uint32_t> add_subscription(std::string_view subject, SubscriptionEntry entry);
  Status check_open_locked() const {
    if (closed_) return close_error_;
    return {};
  }

  void on_completion(const ibv_wc& wc, std::vector<Message>& deliveries, std::vector<Error>& errors);
  void process_frames(std::span<const std::byte> data, std::vector<Message>& deliveries, std::vector<Error>& errors);
  void dispatch(std::vector<Message>& deliveries, std::vector<Error>& errors);

  std::byte* send_buf(std::uint32_t i) { return send_mem_.get() + std::size_t{i} * max_frame_; }

  const ParsedUrl url_;
  ClientOptions opt_;
  std::string description_;
  std::uint32_t max_frame_ = 0;
  std::uint32_t recv_buffer_size_ = 0;

  // Verbs resources in creation order; teardown_resources() undoes them in reverse.
  verbs::EventChannelPtr cm_channel_;
  verbs::CmIdPtr id_;
  verbs::PdPtr pd_;
  verbs::CompChannelPtr comp_channel_;
  verbs::CqPtr cq_;
  verbs::CqEventAcker acker_;
  verbs::CmQp qp_;
  std::unique_ptr<std::byte[]> recv_mem_;
  verbs::MrPtr recv_mr_;
  std::unique_ptr<std::byte[]> send_mem_;
  verbs::MrPtr send_mr_;
  UniqueFd wake_fd_;
  UniqueFd epoll_;
  std::thread io_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // send buffer freed, PONG received, closed
  bool established_ = false;
  bool closed_ = false;
  bool stop_ = false;
  bool closing_ = false;  // close() has begun
  Error close_error_{ErrorKind::kClosed, ""};
  CreditWindow credits_;
  std::vector<std::uint32_t> free_send_;   // send buffer indices
  std::deque<std::pair<std::uint32_t, std::uint32_t>> ready_;  // (buffer, length) filled, not posted
  std::uint32_t open_buf_ = kNoBuffer;     // being filled
  std::uint32_t open_len_ = 0;
  std::deque<std::uint32_t> inflight_;     // buffers posted (kNoBuffer: credit update)
  std::uint64_t next_sequence_ = 1;
  std::uint64_t pings_sent_ = 0;
  std::uint64_t pongs_received_ = 0;
  std::uint32_t next_sid_ = 1;
  std::unordered_map<std::uint32_t, SubscriptionEntry> subs_;
};

// ---------------------------------------------------------------- connect

Result<rdma_cm_event_type> RdmaClient::wait_cm_event(rdma_cm_event_type expected, Clock::time_point deadline,
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
                                                    std::to_string(ev->status) + ": " + std::strerror(std::abs(ev->status)) + ")"};
      }
      return ev->event;
    }
    if (errno != EAGAIN) return sys_error(ErrorKind::kConnectFailed, "rdma_get_cm_event");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Error{ErrorKind::kTimeout, "timed out waiting for " + std::string(rdma_event_str(expected))};
    pollfd p{cm_channel_->fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left));
  }
}

Status RdmaClient::connect() {
  proto::ConnectReject reject{};
  Status st = connect_once(opt_.recv_buffer_size, &reject);
  if (!st && st.error().kind == ErrorKind::kRejected && reject.reason == proto::RejectReason::kBufferTooSmall &&
      reject.required_buffer_size > opt_.recv_buffer_size && reject.required_buffer_size <= proto::kMaxBufferSize) {
    // The broker told us the size it needs: one more try with that.
    teardown_resources();
    st = connect_once(reject.required_buffer_size, &reject);
  }
  if (!st) {
    teardown_resources();
    return st;
  }
  io_thread_ = std::thread([this] { run(); });
  return {};
}

Status RdmaClient::connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject) {
  const auto deadline = Clock::now() + opt_.connect_timeout;
  const std::string where = url_.host + ":" + std::to_string(url_.port);
  recv_buffer_size_ = recv_buffer_size;
  cm_channel_.reset(rdma_create_event_channel());
  if (!cm_channel_) return sys_error(ErrorKind::kResource, "rdma_create_event_channel");
  set_nonblocking(cm_channel_->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(cm_channel_.get(), &id, nullptr, RDMA_PS_TCP) != 0) return sys_error(ErrorKind::kResource, "rdma_create_id");
  id_.reset(id);

  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* dst = nullptr;
  if (int rc = getaddrinfo(url_.host.c_str(), std::to_string(url_.port).c_str(), &hints, &dst); rc != 0) {
    return Error{ErrorKind::kInvalidArgument, "cannot resolve " + url_.host + ": " + gai_strerror(rc)};
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> dst_owner(dst, freeaddrinfo);
  addrinfo* src = nullptr;
  if (!opt_.bind_address.empty()) {
    if (int rc = getaddrinfo(opt_.bind_address.c_str(), nullptr, &hints, &src); rc != 0) {
      return Error{ErrorKind::kInvalidArgument, "bad bind address " + opt_.bind_address + ": " + gai_strerror(rc)};
    }
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> src_owner(src, freeaddrinfo);
  // rdma_cm timeouts stay generous: under emulation or contention a resolve
  // can take seconds.
  if (rdma_resolve_addr(id, src != nullptr ? src->ai_addr : nullptr, dst->ai_addr, 2000) != 0) {
    return sys_error(ErrorKind::kConnectFailed, "rdma_resolve_addr(" + where + ")");
  }
  if (auto ev = wait_cm_event(RDMA_CM_EVENT_ADDR_RESOLVED, deadline, nullptr); !ev || *ev != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return Error{ErrorKind::kConnectFailed, "resolving " + where + ": " +
                                                (ev ? std::string(rdma_event_str(*ev)) : ev.error().message) +
                                                " (is an RDMA device up with a route to it?)"};
  }
  if (rdma_resolve_route(id, 2000) != 0) return sys_error(ErrorKind::kConnectFailed, "rdma_resolve_route(" + where + ")");
  if (auto ev = wait_cm_event(RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, nullptr); !ev || *ev != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return Error{ErrorKind::kConnectFailed, "route to " + where + ": " + (ev ? std::string(rdma_event_str(*ev)) : ev.error().message)};
  }

  // Resources on the device the route chose.
  pd_.reset(ibv_alloc_pd(id->verbs));
  if (!pd_) return sys_error(ErrorKind::kResource, "ibv_alloc_pd");
  comp_channel_.reset(ibv_create_comp_channel(id->verbs));
  if (!comp_channel_) return sys_error(ErrorKind::kResource, "ibv_create_comp_channel");
  set_nonblocking(comp_channel_->fd);
  const int cqe = static_cast<int>(opt_.recv_credits + opt_.max_inflight_sends + 2);
  cq_.reset(ibv_create_cq(id->verbs, cqe, nullptr, comp_channel_.get(), 0));
  if (!cq_) return sys_error(ErrorKind::kResource, "ibv_create_cq");
  acker_.attach(cq_.get());
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_.get();
  attr.recv_cq = cq_.get();
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = opt_.max_inflight_sends + 1;
  attr.cap.max_recv_wr = opt_.recv_credits;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd_.get(), &attr) != 0) return sys_error(ErrorKind::kResource, "rdma_create_qp");
  qp_ = verbs::CmQp(id);

  const std::size_t recv_bytes = std::size_t{opt_.recv_credits} * recv_buffer_size;
  recv_mem_.reset(new std::byte[recv_bytes]);
  recv_mr_.reset(ibv_reg_mr(pd_.get(), recv_mem_.get(), recv_bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!recv_mr_) return sys_error(ErrorKind::kResource, "ibv_reg_mr (receive buffers; check ulimit -l)");
  for (std::uint32_t i = 0; i < opt_.recv_credits; ++i) {
    ibv_sge sge{reinterpret_cast<std::uint64_t>(recv_mem_.get() + std::size_t{i} * recv_buffer_size), recv_buffer_size,
                recv_mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = kRecvFlag | i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp_.get(), &wr, &bad) != 0) return sys_error(ErrorKind::kResource, "ibv_post_recv");
  }

  auto pdata = proto::encode(proto::ConnectRequest{recv_buffer_size, opt_.recv_credits});
  rdma_conn_param param{};
  param.private_data = pdata.data();
  param.private_data_len = static_cast<std::uint8_t>(pdata.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // safety net only: credits keep a receive posted
  if (rdma_connect(id, &param) != 0) return sys_error(ErrorKind::kConnectFailed, "rdma_connect(" + where + ")");
  std::vector<std::byte> reply;
  auto ev = wait_cm_event(RDMA_CM_EVENT_ESTABLISHED, deadline, &reply);
  if (!ev) return ev.error();
  if (*ev == RDMA_CM_EVENT_REJECTED) {
    if (proto::decode(reply, *reject) == proto::HandshakeStatus::kOk) {
      std::string msg = "broker at " + where + " refused the connection: " + std::string(proto::to_string(reject->reason));
      if (reject->reason == proto::RejectReason::kBufferTooSmall) {
        msg += " (it needs " + std::to_string(reject->required_buffer_size) + "-byte receive buffers)";
      }
      return Error{ErrorKind::kRejected, msg};
    }
    return Error{ErrorKind::kRejected, "connection to " + where + " rejected (no rdmabroker listening there?)"};
  }
  if (*ev != RDMA_CM_EVENT_ESTABLISHED) {
    return Error{ErrorKind::kConnectFailed, "connecting to " + where + ": " + rdma_event_str(*ev)};
  }
  proto::ConnectAccept accept;
  if (auto st = proto::decode(reply, accept); st != proto::HandshakeStatus::kOk) {
    return Error{ErrorKind::kConnectFailed, "bad accept from " + where + ": " + std::string(proto::to_string(st))};
  }
  max_frame_ = accept.max_frame_size;

  const std::uint32_t nsend = opt_.max_inflight_sends + opt_.send_queue_buffers;
  const std::size_t send_bytes = std::size_t{nsend} * max_frame_;
  send_mem_.reset(new std::byte[send_bytes]);
  send_mr_.reset(ibv_reg_mr(pd_.get(), send_mem_.get(), send_bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!send_mr_) return sys_error(ErrorKind::kResource, "ibv_reg_mr (send buffers; check ulimit -l)");
  for (std::uint32_t i = nsend; i-- > 0;) free_send_.push_back(i);

  credits_ = CreditWindow(opt_.recv_credits);
  credits_.grant_initial(opt_.recv_credits);
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

  char local[INET6_ADDRSTRLEN] = "?";
  auto* sa = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(id));
  inet_ntop(AF_INET, &sa->sin_addr, local, sizeof local);
  description_ = "rdma " + std::string(ibv_get_device_name(id->verbs->device)) + " " + local + " -> " + where +
                 " (connection " + std::to_string(accept.connection_id) + ")";
  established_ = true;
  return {};
}

void RdmaClient::teardown_resources() {
  // Reverse order of creation: QP, MRs, CQ, completion channel, PD, cm_id, channel.
  qp_.reset();
  send_mr_.reset();
  recv_mr_.reset();
  acker_.flush();
  cq_.reset();
  comp_channel_.reset();
  pd_.reset();
  id_.reset();
  cm_channel_.reset();
  free_send_.clear();
  ready_.clear();
  inflight_.clear();
  open_buf_ = kNoBuffer;
}

// ---------------------------------------------------------------- API

Status RdmaClient::append_frame_locked(std::unique_lock<std::mutex>& lock, const proto::FrameHeader& h,
                                       std::string_view subject, std::span<const std::byte> payload) {
  const std::size_t len = proto::align_up(proto::kHeaderSize + subject.size() + payload.size());
  const auto deadline = Clock::now() + opt_.publish_timeout;
  while (true) {
    if (auto st = check_open_locked(); !st) return st;
    if (open_buf_ != kNoBuffer && open_len_ + len > max_frame_) {
      ready_.emplace_back(open_buf_, open_len_);
      open_buf_ = kNoBuffer;
    }
    if (open_buf_ == kNoBuffer && !free_send_.empty()) {
      open_buf_ = free_send_.back();
      free_send_.pop_back();
      open_len_ = 0;
    }
    if (open_buf_ != kNoBuffer) break;
    // Every send buffer is full or in flight: wait for a completion.
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && free_send_.empty()) {
      return Error{ErrorKind::kTimeout, "send queue full for " + std::to_string(opt_.publish_timeout.count()) +
                                            " ms (the broker is not granting credits)"};
    }
  }
  proto::FrameHeader hdr = h;
  hdr.sequence = next_sequence_++;
  proto::encode_frame(std::span<std::byte>(send_buf(open_buf_) + open_len_, len), hdr, subject, {}, payload);
  open_len_ += static_cast<std::uint32_t>(len);
  try_post_locked();
  return {};
}

Status RdmaClient::publish(std::string_view subject, std::span<const std::byte> payload) {
  if (auto st = check_subject(subject); !st) return st;
  std::unique_lock lock(mu_);
  if (auto st = check_open_locked(); !st) return st;
  if (payload.size() > max_payload(subject.size())) {
    return Error{ErrorKind::kPayloadTooLarge, "payload of " + std::to_string(payload.size()) +
                                                  " bytes exceeds the broker's limit of " +
                                                  std::to_string(max_payload(subject.size())) + " for this subject"};
  }
  proto::FrameHeader h;
  h.type = FrameType::kPublish;
  return append_frame_locked(lock, h, subject, payload);
}

Result<std::uint32_t> RdmaClient::add_subscription(std::string_view subject, SubscriptionEntry entry) {
  std::unique_lock lock(mu_);
  const std::uint32_t sid = next_sid_++;
  if (entry.queue == nullptr && entry.handler == nullptr) {
    entry.queue = std::make_shared<QueueSubscription>(sid, opt_.subscription_queue_limit);
  }
  subs_[sid] = std::move(entry);
  proto::FrameHeader h;
  h.type = FrameType::kSubscribe;
  h.arg = sid;
  if (auto st = append_frame_locked(lock, h, subject, {}); !st) {
    subs_.erase(sid);
    return st.error();
  }
  return sid;
}

Result<std::uint32_t> RdmaClient::subscribe(std::string_view subject, MessageHandler handler) {
  if (auto st = check_subject(subject, true); !st) return st.error();
  if (!handler) return Error{ErrorKind::kInvalidArgument, "subscribe needs a handler"};
  return add_subscription(subject, SubscriptionEntry{std::string(subject), std::move(handler), nullptr});
}

Result<std::shared_ptr<Subscription>> RdmaClient::subscribe(std::string_view subject) {
  if (auto st = check_subject(subject, true); !st) return st.error();
  auto sid = add_subscription(subject, SubscriptionEntry{std::string(subject), nullptr, nullptr});
  if (!sid) return sid.error();
  std::lock_guard lock(mu_);
  auto it = subs_.find(sid.value());
  if (it == subs_.end()) return Error{ErrorKind::kClosed, "subscription removed while being created"};
  return std::shared_ptr<Subscription>(it->second.queue);
}

Status RdmaClient::unsubscribe(std::uint32_t sid) {
  std::unique_lock lock(mu_);
  auto it = subs_.find(sid);
  if (it == subs_.end()) return Error{ErrorKind::kInvalidArgument, "no subscription " + std::to_string(sid)};
  if (it->second.queue) it->second.queue->close("unsubscribed");
  subs_.erase(it);
  proto::FrameHeader h;
  h.type = FrameType::kUnsubscribe;
  h.arg = sid;
  return append_frame_locked(lock, h, {}, {});
}

Status RdmaClient::flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  proto::FrameHeader h;
  h.type = FrameType::kPing;
  if (auto st = append_frame_locked(lock, h, {}, {}); !st) return st;
  const std::uint64_t my_ping = ++pings_sent_;
  // PONGs come back in PING order: the n-th PONG answers the n-th PING.
  if (!cv_.wait_for(lock, timeout, [&] { return pongs_received_ >= my_ping || closed_; })) {
    return Error{ErrorKind::kTimeout, "flush: no PONG within " + std::to_string(timeout.count()) + " ms"};
  }
  if (pongs_received_ >= my_ping) return {};
  return close_error_;
}

void RdmaClient::close() {
  {
    std::unique_lock lock(mu_);
    if (!established_) return;
    closing_ = true;  // the disconnect that follows is ours, not an error to report
    if (!closed_) {
      proto::FrameHeader h;
      h.type = FrameType::kClose;
      if (append_frame_locked(lock, h, {}, {})) {
        // Give what is queued a moment to leave before the disconnect.
        cv_.wait_for(lock, std::chrono::seconds(2), [&] { return closed_ || (ready_.empty() && open_buf_ == kNoBuffer && inflight_.empty()); });
      }
      fail_locked(Error{ErrorKind::kClosed, "client closed the connection"});
    }
    stop_ = true;
  }
  rdma_disconnect(id_.get());
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
  if (io_thread_.joinable()) io_thread_.join();
  established_ = false;
  teardown_resources();
}

// ---------------------------------------------------------------- sending

void RdmaClient::try_post_locked() {
  if (closed_) return;
  while (inflight_.size() < opt_.max_inflight_sends) {
    const bool has_data = !ready_.empty() || open_buf_ != kNoBuffer;
    if (!has_data || !credits_.can_send_data()) {
      // No data, or no credit for it: owed credits may still have to go back,
      // using the reserved last credit if need be.
      if (credits_.should_return() && credits_.can_send_credit_update()) post_locked(kNoBuffer, 0);
      return;
    }
    std::uint32_t buf = kNoBuffer, len = 0;
    if (!ready_.empty()) {
      std::tie(buf, len) = ready_.front();
      ready_.pop_front();
    } else {
      // Idle enough to post the buffer being filled right away: batching only
      // happens while sends are in flight, so it adds no latency at light load.
      buf = std::exchange(open_buf_, kNoBuffer);
      len = open_len_;
    }
    if (!post_locked(buf, len)) return;
  }
}

bool RdmaClient::post_locked(std::uint32_t buffer, std::uint32_t len) {
  ibv_sge sge{};
  ibv_send_wr wr{};
  wr.wr_id = buffer;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(credits_.take_owed(proto::kMaxCreditsPerImm));
  wr.send_flags = IBV_SEND_SIGNALED;
  if (buffer != kNoBuffer) {
    sge = ibv_sge{reinterpret_cast<std::uint64_t>(send_buf(buffer)), len, send_mr_->lkey};
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_.get(), &wr, &bad) != 0) {
    fail_locked(sys_error(ErrorKind::kClosed, "ibv_post_send"));
    return false;
  }
  credits_.consume_send();
  inflight_.push_back(buffer);
  return true;
}

void RdmaClient::fail_locked(Error why) {
  if (closed_) return;
  closed_ = true;
  close_error_ = std::move(why);
  for (auto& [sid, e] : subs_) {
    if (e.queue) e.queue->close(close_error_.message);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------- I/O thread

void RdmaClient::run() {
  std::vector<Message> deliveries;
  std::vector<Error> errors;
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (stop_) break;
    }
    epoll_event evs[4];
    const int n = ::epoll_wait(epoll_.get(), evs, 4, 100);
    bool cm_ready = false;
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == comp_channel_->fd) {
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        while (ibv_get_cq_event(comp_channel_.get(), &cq, &ctx) == 0) acker_.add();
      } else if (fd == cm_channel_->fd) {
        cm_ready = true;
      } else {
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_fd_.get(), &v, sizeof v);
      }
    }
    // Drain, re-arm, drain again (a completion between the two raises no event).
    // Completions go first: a CLOSE frame from the broker completes here before
    // its DISCONNECTED event, and it says why the connection ends.
    for (int pass = 0; pass < 2; ++pass) {
      ibv_wc wcs[32];
      int got;
      while ((got = ibv_poll_cq(cq_.get(), 32, wcs)) > 0) {
        for (int i = 0; i < got; ++i) on_completion(wcs[i], deliveries, errors);
      }
      if (pass == 0) ibv_req_notify_cq(cq_.get(), 0);
    }
    rdma_cm_event* ev = nullptr;
    while (cm_ready && rdma_get_cm_event(cm_channel_.get(), &ev) == 0) {
      verbs::CmEventPtr owned(ev);
      if (ev->event == RDMA_CM_EVENT_DISCONNECTED || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        std::lock_guard lock(mu_);
        if (!closed_ && !closing_) errors.push_back(Error{ErrorKind::kClosed, "connection to the broker lost"});
        fail_locked(Error{ErrorKind::kClosed, "connection to the broker lost (" +
                                                  std::string(rdma_event_str(ev->event)) + ")"});
      }
    }
    {
      std::lock_guard lock(mu_);
      try_post_locked();
    }
    dispatch(deliveries, errors);
  }
}

void RdmaClient::on_completion(const ibv_wc& wc, std::vector<Message>& deliveries, std::vector<Error>& errors) {
  if ((wc.wr_id & kRecvFlag) != 0) {
    const auto idx = static_cast<std::uint32_t>(wc.wr_id & ~kRecvFlag);
    if (wc.status != IBV_WC_SUCCESS) {
      std::lock_guard lock(mu_);
      if (!closed_ && wc.status != IBV_WC_WR_FLUSH_ERR) {
        errors.push_back(Error{ErrorKind::kClosed, std::string("receive failed: ") + ibv_wc_status_str(wc.status)});
      }
      fail_locked(Error{ErrorKind::kClosed, std::string("receive failed: ") + ibv_wc_status_str(wc.status)});
      return;
    }
    std::byte* buf = recv_mem_.get() + std::size_t{idx} * recv_buffer_size_;
    process_frames({buf, wc.byte_len}, deliveries, errors);
    // Repost at once: the frames were copied out.
    ibv_sge sge{reinterpret_cast<std::uint64_t>(buf), recv_buffer_size_, recv_mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wc.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (ibv_post_recv(qp_.get(), &wr, &bad) != 0) {
      fail_locked(sys_error(ErrorKind::kClosed, "ibv_post_recv"));
      return;
    }
    if (!credits_.on_receive()) {
      fail_locked(Error{ErrorKind::kClosed, "broker sent without a credit (protocol violation)"});
      return;
    }
    if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) credits_.add_send_credits(ntohl(wc.imm_data));
    return;
  }
  std::lock_guard lock(mu_);
  if (!inflight_.empty()) {
    const std::uint32_t buf = inflight_.front();
    inflight_.pop_front();
    if (buf != kNoBuffer) free_send_.push_back(buf);
  }
  if (wc.status != IBV_WC_SUCCESS && !closed_) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      errors.push_back(Error{ErrorKind::kClosed, std::string("send failed: ") + ibv_wc_status_str(wc.status)});
    }
    fail_locked(Error{ErrorKind::kClosed, std::string("send failed: ") + ibv_wc_status_str(wc.status)});
  }
  cv_.notify_all();
}

void RdmaClient::process_frames(std::span<const std::byte> data, std::vector<Message>& deliveries,
                                std::vector<Error>& errors) {
  std::size_t off = 0;
  while (off < data.size()) {
    proto::Frame f;
    const auto st = proto::decode_frame(data.subspan(off), recv_buffer_size_, f);
    if (st != proto::DecodeStatus::kOk) {
      std::lock_guard lock(mu_);
      errors.push_back(Error{ErrorKind::kBrokerError, "undecodable frame from the broker: " + std::string(proto::to_string(st))});
      fail_locked(errors.back());
      return;
    }
    switch (f.header.type) {
      case FrameType::kDeliver: {
        const auto st = proto::for_each_delivered(f, [&](const proto::Frame& inner) {
          Message m;
          m.sid = f.header.arg;
          m.subject.assign(inner.subject);
          m.payload.assign(inner.payload.begin(), inner.payload.end());
          deliveries.push_back(std::move(m));
        });
        if (st != proto::DecodeStatus::kOk) {
          std::lock_guard lock(mu_);
          errors.push_back(Error{ErrorKind::kBrokerError, "undecodable DELIVER from the broker: " + std::string(proto::to_string(st))});
          fail_locked(errors.back());
          return;
        }
        break;
      }
      case FrameType::kPong: {
        std::lock_guard lock(mu_);
        ++pongs_received_;
        cv_.notify_all();
        break;
      }
      case FrameType::kCredit: {
        std::lock_guard lock(mu_);
        credits_.add_send_credits(f.header.arg);
        break;
      }
      case FrameType::kError:
      case FrameType::kClose: {
        const auto code = static_cast<proto::ErrorCode>(f.header.arg);
        std::string text(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
        std::string msg = "broker: " + std::string(proto::to_string(code)) + (text.empty() ? "" : ": " + text);
        errors.push_back(Error{ErrorKind::kBrokerError, msg});
        if (f.header.type == FrameType::kClose) {
          std::lock_guard lock(mu_);
          fail_locked(Error{ErrorKind::kClosed, "broker closed the connection: " + std::string(proto::to_string(code))});
        }
        break;
      }
      default:
        break;  // client-to-broker types are never sent to us; ignore
    }
    off += f.header.frame_len();
  }
}

void RdmaClient::dispatch(std::vector<Message>& deliveries, std::vector<Error>& errors) {
  for (auto& m : deliveries) {
    MessageHandler handler;
    std::shared_ptr<QueueSubscription> queue;
    {
      std::lock_guard lock(mu_);
      auto it = subs_.find(m.sid);
      if (it == subs_.end()) continue;  // unsubscribed while in flight
      handler = it->second.handler;
      queue = it->second.queue;
    }
    if (handler) {
      handler(m);
    } else if (queue && !queue->push(std::move(m))) {
      errors.push_back(Error{ErrorKind::kResource, "subscription " + std::to_string(queue->sid()) +
                                                       ": local queue limit reached, message dropped"});
    }
  }
  deliveries.clear();
  if (opt_.on_error) {
    for (const auto& e : errors) opt_.on_error(e);
  }
  errors.clear();
}

}  // namespace

Result<std::unique_ptr<Client>> connect_rdma(const ParsedUrl& url, ClientOptions options) {
  auto client = std::make_unique<RdmaClient>(url, std::move(options));
  if (auto st = client->connect(); !st) return st.error();
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace rdmabroker
