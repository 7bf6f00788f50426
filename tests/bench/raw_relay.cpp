// SPDX-License-Identifier: Apache-2.0
// The floor a broker's relay is measured against (issue 47): three processes,
// publisher -> relay -> subscriber, on raw verbs and rdma_cm (RC SENDs into
// pre-posted receives), no framing, no routing. Two measures:
//
// Latency (64-byte messages, tests/bench/raw-relay.sh, latency-budget.sh).
// The relay forwards each message as it arrives. Everything else is what
// `rdmabroker bench -r RATE -d SECONDS` does: the publisher sends on a fixed
// schedule, and the subscriber measures each message from its scheduled time
// (a message that waits behind a late one counts its wait: corrected for
// coordinated omission) and from the publisher's post call.
//
//   raw_relay relay ADDR PORT MODE
//   raw_relay sub   ADDR PORT MODE BIND
//   raw_relay pub   ADDR PORT MODE BIND RATE SECONDS
//
// MODE: events (relay and subscriber sleep on their completion channels
// when they have nothing to do, as the broker and the clients do by
// default) or polled (they spin on their CQs, as a polled client and a
// busy-polling worker do); the publisher sleeps until each message is due
// in both, as the bench's does. The relay takes the subscriber and the publisher in
// either order. The subscriber prints its report; its last three lines are
// p99_us, p99_9_us and p50_us from the post call, in µs.
//
// Bytes per second (messages of SIZE bytes flat out, tests/bench/large.sh):
// the publisher sends COUNT messages, one SEND each, as fast as the relay's
// credits let it; the relay forwards each from the buffer it arrived in (no
// copy, as the broker forwards from its pool) and, once the subscriber has
// it, posts that buffer again and returns the publisher a credit; everyone
// sleeps on completion channels, as the broker and the clients do by
// default. What `rdmabroker bench --size SIZE -n COUNT` measures: from the
// publisher's start to the last delivery; the subscriber's last line is
// `mb_per_s N` (10^6 bytes).
//
//   raw_relay bulk-relay ADDR PORT SIZE
//   raw_relay bulk-sub   ADDR PORT BIND SIZE COUNT
//   raw_relay bulk-pub   ADDR PORT BIND SIZE COUNT
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "latency_histogram.hpp"

namespace {

constexpr std::size_t kMessage = 64;   // bytes per SEND
constexpr std::uint32_t kDepth = 256;  // receives posted, sends in flight
constexpr std::uint64_t kEnd = ~std::uint64_t{0};
constexpr char kSubscriber = 'S', kPublisher = 'P';

/// What a publisher's message carries (the rest of its 64 bytes is zero).
struct Stamp {
  std::uint64_t seq = 0;
  std::int64_t scheduled_ns = 0;
  std::int64_t posted_ns = 0;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "raw_relay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct AddrInfoDeleter {
  void operator()(rdma_addrinfo* ai) const { rdma_freeaddrinfo(ai); }
};
using AddrInfo = std::unique_ptr<rdma_addrinfo, AddrInfoDeleter>;

/// A registered region (MR before PD: it goes before the endpoint's QP and
/// PD do).
struct MrDeleter {
  void operator()(ibv_mr* mr) const { ibv_dereg_mr(mr); }
};
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;

/// How many buffers of what size an endpoint receives into and sends from.
struct Shape {
  std::size_t recv_size = kMessage;
  std::uint32_t recv_depth = kDepth;
  std::size_t send_size = kMessage;
  std::uint32_t send_depth = kDepth;
};

/// One endpoint: its cm_id with QP (and, made by rdma_create_ep, CQs) and the
/// buffers its receives and sends use, registered with its QP's PD. The
/// regions go before the endpoint (MR before PD and QP); the endpoint takes
/// its QP, the CQs librdmacm made for it and its cm_id with it, the cm_id
/// last.
class Endpoint {
 public:
  Endpoint(rdma_cm_id* id, Shape shape = {})
      : id_(id),
        shape_(shape),
        recv_(shape.recv_size * shape.recv_depth),
        send_(shape.send_size * shape.send_depth) {
    recv_mr_ = register_region(recv_);
    send_mr_ = register_region(send_);
  }
  ~Endpoint() {
    if (connected_) rdma_disconnect(id_);
    recv_mr_.reset();
    send_mr_.reset();
    rdma_destroy_ep(id_);
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  rdma_cm_id* id() const { return id_; }
  ibv_mr* recv_mr() const { return recv_mr_.get(); }
  ibv_mr* send_mr() const { return send_mr_.get(); }
  void set_connected() { connected_ = true; }
  std::byte* recv_slot(std::uint64_t i) { return recv_.data() + i * shape_.recv_size; }
  std::byte* send_slot(std::uint64_t i) { return send_.data() + (i % shape_.send_depth) * shape_.send_size; }

  void post_recv(std::uint64_t slot) {
    if (rdma_post_recv(id_, reinterpret_cast<void*>(slot), recv_slot(slot), shape_.recv_size,
                       recv_mr_.get()) != 0)
      die("rdma_post_recv");
  }
  void post_all_recvs() {
    for (std::uint64_t i = 0; i < shape_.recv_depth; ++i) post_recv(i);
  }
  /// Sends send slot `n` (its first `len` bytes; all of it by default);
  /// waits for a free slot when send_depth are in flight.
  void send(std::uint64_t n, bool events, std::size_t len = 0) {
    while (inflight_ >= shape_.send_depth) reap_sends(events, true);
    send_from(send_slot(n), len == 0 ? shape_.send_size : len, send_mr_.get(), 0);
  }
  /// Sends `len` bytes at `addr` (in `mr`, of this endpoint's PD), its
  /// completion tagged `wr_id`.
  void send_from(std::byte* addr, std::size_t len, ibv_mr* mr, std::uint64_t wr_id) {
    if (rdma_post_send(id_, reinterpret_cast<void*>(wr_id), addr, len, mr, IBV_SEND_SIGNALED) != 0)
      die("rdma_post_send");
    ++inflight_;
  }
  /// A send completion taken from a CQ this endpoint shares.
  void sent() { --inflight_; }
  /// Takes the send completions there are (all of them when `all`; waiting
  /// for one when `wait`).
  void reap_sends(bool events, bool wait) {
    ibv_wc wc{};
    int n = ibv_poll_cq(id_->send_cq, 1, &wc);
    while (n == 0 && wait) {
      if (events) {
        if (rdma_get_send_comp(id_, &wc) < 0) die("rdma_get_send_comp");
        n = 1;
      } else {
        n = ibv_poll_cq(id_->send_cq, 1, &wc);
      }
    }
    for (; n > 0; n = ibv_poll_cq(id_->send_cq, 1, &wc)) {
      if (wc.status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "raw_relay: send completion: %s\n", ibv_wc_status_str(wc.status));
        std::exit(1);
      }
      --inflight_;
    }
  }
  void drain_sends(bool events) {
    while (inflight_ > 0) reap_sends(events, true);
  }
  /// A message as the subscriber takes it: its completion, when that was
  /// taken, and its stamp; its buffer is posted again at once.
  struct Arrival {
    ibv_wc wc;
    std::int64_t at_ns;
    Stamp stamp;
  };
  Arrival receive_message(bool events) {
    Arrival a{next_recv(events), now_ns(), {}};
    const auto slot = static_cast<std::uint64_t>(a.wc.wr_id);
    std::memcpy(&a.stamp, recv_slot(slot), sizeof a.stamp);
    post_recv(slot);
    return a;
  }
  /// A receive completion if there is one, without waiting.
  bool try_recv(ibv_wc& wc) {
    const int n = ibv_poll_cq(id_->recv_cq, 1, &wc);
    if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS)) {
      std::fprintf(stderr, "raw_relay: receive completion: %s\n", ibv_wc_status_str(wc.status));
      std::exit(1);
    }
    return n == 1;
  }
  /// The next receive completion: spinning, or asleep on the channel when
  /// none is there (rdma_get_recv_comp polls before it arms and sleeps).
  ibv_wc next_recv(bool events) {
    ibv_wc wc{};
    if (events) {
      if (rdma_get_recv_comp(id_, &wc) < 0) die("rdma_get_recv_comp");
    } else {
      while (ibv_poll_cq(id_->recv_cq, 1, &wc) == 0) {
      }
    }
    if (wc.status != IBV_WC_SUCCESS) {
      std::fprintf(stderr, "raw_relay: receive completion: %s\n", ibv_wc_status_str(wc.status));
      std::exit(1);
    }
    return wc;
  }

 private:
  MrPtr register_region(std::vector<std::byte>& region) {
    if (region.empty()) return nullptr;
    MrPtr mr(ibv_reg_mr(id_->qp->pd, region.data(), region.size(), IBV_ACCESS_LOCAL_WRITE));
    if (!mr) die("ibv_reg_mr");
    return mr;
  }

  rdma_cm_id* id_;
  Shape shape_;
  std::vector<std::byte> recv_, send_;
  MrPtr recv_mr_, send_mr_;
  std::uint32_t inflight_ = 0;
  bool connected_ = false;
};

ibv_qp_init_attr qp_attributes(std::uint32_t send_wr = kDepth, std::uint32_t recv_wr = kDepth) {
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = send_wr;
  attr.cap.max_recv_wr = recv_wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.qp_type = IBV_QPT_RC;
  return attr;
}

rdma_conn_param connection_parameters(const char* role) {
  rdma_conn_param p{};
  p.private_data = role;
  p.private_data_len = role == nullptr ? 0 : 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;  // a receive not yet posted is waited for, never an error
  return p;
}

AddrInfo resolve(const char* addr, const char* port, bool passive, const char* bind) {
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_TCP;
  if (passive) hints.ai_flags = RAI_PASSIVE;
  sockaddr_in source{};
  if (bind != nullptr) {
    source.sin_family = AF_INET;
    if (inet_pton(AF_INET, bind, &source.sin_addr) != 1) die(std::string("bad address ") + bind);
    hints.ai_src_addr = reinterpret_cast<sockaddr*>(&source);
    hints.ai_src_len = sizeof source;
  }
  rdma_addrinfo* res = nullptr;
  if (rdma_getaddrinfo(addr, port, &hints, &res) != 0) die(std::string("rdma_getaddrinfo ") + addr);
  return AddrInfo(res);
}

/// Connects to the relay as `role`, receives posted first.
std::unique_ptr<Endpoint> dial(const char* addr, const char* port, const char* bind, const char* role,
                               Shape shape = {}) {
  const AddrInfo ai = resolve(addr, port, false, bind);
  ibv_qp_init_attr attr = qp_attributes(std::max(shape.send_depth, 1U), std::max(shape.recv_depth, 1U));
  rdma_cm_id* id = nullptr;
  if (rdma_create_ep(&id, ai.get(), nullptr, &attr) != 0) die("rdma_create_ep");
  auto ep = std::make_unique<Endpoint>(id, shape);
  ep->post_all_recvs();
  rdma_conn_param p = connection_parameters(role);
  if (rdma_connect(id, &p) != 0) die("rdma_connect");
  ep->set_connected();
  return ep;
}

/// The relay's listening cm_id (requests come with a QP made from `attr`
/// when it is given, without one when it is null), said on stdout.
using Listener = std::unique_ptr<rdma_cm_id, void (*)(rdma_cm_id*)>;
Listener listen_on(const char* addr, const char* port, ibv_qp_init_attr* attr) {
  const AddrInfo ai = resolve(addr, port, true, nullptr);
  rdma_cm_id* listen_id = nullptr;
  if (rdma_create_ep(&listen_id, ai.get(), nullptr, attr) != 0) die("rdma_create_ep (listen)");
  Listener listener(listen_id, rdma_destroy_ep);
  if (rdma_listen(listen_id, 2) != 0) die("rdma_listen");
  std::printf("relay: listening\n");
  std::fflush(stdout);
  return listener;
}

/// The next connection request and who sends it (kSubscriber, kPublisher).
rdma_cm_id* next_request(rdma_cm_id* listen_id, char& role) {
  rdma_cm_id* id = nullptr;
  if (rdma_get_request(listen_id, &id) != 0) die("rdma_get_request");
  const auto& conn = id->event->param.conn;
  role = conn.private_data_len >= 1 ? *static_cast<const char*>(conn.private_data) : '?';
  return id;
}

int relay(const char* addr, const char* port, bool events) {
  ibv_qp_init_attr attr = qp_attributes();
  const Listener listener = listen_on(addr, port, &attr);
  std::unique_ptr<Endpoint> sub, pub;
  while (!sub || !pub) {
    char role = 0;
    rdma_cm_id* id = next_request(listener.get(), role);
    auto ep = std::make_unique<Endpoint>(id);
    ep->post_all_recvs();
    rdma_conn_param p = connection_parameters(nullptr);
    if (rdma_accept(id, &p) != 0) die("rdma_accept");
    ep->set_connected();
    (role == kSubscriber ? sub : pub) = std::move(ep);
  }
  for (std::uint64_t n = 0;; ++n) {
    const ibv_wc wc = pub->next_recv(events);
    const auto slot = static_cast<std::uint64_t>(wc.wr_id);
    std::memcpy(sub->send_slot(n), pub->recv_slot(slot), kMessage);
    Stamp stamp;
    std::memcpy(&stamp, pub->recv_slot(slot), sizeof stamp);
    pub->post_recv(slot);
    sub->send(n, events);
    sub->reap_sends(events, false);
    if (stamp.seq == kEnd) break;
  }
  sub->drain_sends(events);
  return 0;
}

int subscribe(const char* addr, const char* port, bool events, const char* bind) {
  auto ep = dial(addr, port, bind, "S");
  std::printf("sub: connected\n");
  std::fflush(stdout);
  rdmabroker::bench::LatencyHistogram from_schedule, from_post;
  std::uint64_t expected = 0, out_of_order = 0;
  for (;;) {
    const auto [wc, now, stamp] = ep->receive_message(events);
    if (stamp.seq == kEnd) break;
    if (stamp.seq != expected) ++out_of_order;
    expected = stamp.seq + 1;
    from_schedule.record(now - stamp.scheduled_ns);
    from_post.record(now - stamp.posted_ns);
  }
  std::printf("messages %llu (out of order %llu)\n", static_cast<unsigned long long>(from_schedule.count()),
              static_cast<unsigned long long>(out_of_order));
  std::printf("from the post call: p50 %.1f us, p99 %.1f us, p99.9 %.1f us\n", from_post.quantile_us(0.5),
              from_post.quantile_us(0.99), from_post.quantile_us(0.999));
  std::printf("from the schedule: p50 %.1f us, p99 %.1f us, p99.9 %.1f us\n", from_schedule.quantile_us(0.5),
              from_schedule.quantile_us(0.99), from_schedule.quantile_us(0.999));
  // The figures latency-budget.sh compares with `publish call -> handler`.
  std::printf("p99_us %.1f\np99_9_us %.1f\np50_us %.1f\n", from_post.quantile_us(0.99),
              from_post.quantile_us(0.999), from_post.quantile_us(0.5));
  return out_of_order == 0 ? 0 : 1;
}

/// Asleep until `t` (steady ns), in either mode: `rdmabroker bench`'s
/// publisher sleeps until each message is due, polled or not.
void sleep_until(std::int64_t t) {
  timespec ts{static_cast<time_t>(t / 1'000'000'000), static_cast<long>(t % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

int publish(const char* addr, const char* port, bool events, const char* bind, double rate, double seconds) {
  auto ep = dial(addr, port, bind, "P");
  const auto count = static_cast<std::uint64_t>(rate * seconds);
  const auto interval = static_cast<std::int64_t>(1e9 / rate);
  const std::int64_t start = now_ns() + 100'000'000;  // the relay's first receive is posted by now
  for (std::uint64_t seq = 0; seq <= count; ++seq) {
    Stamp stamp;
    stamp.seq = seq == count ? kEnd : seq;
    stamp.scheduled_ns = start + static_cast<std::int64_t>(seq) * interval;
    sleep_until(stamp.scheduled_ns);
    stamp.posted_ns = now_ns();
    std::memset(ep->send_slot(seq), 0, kMessage);
    std::memcpy(ep->send_slot(seq), &stamp, sizeof stamp);
    ep->send(seq, events);
    ep->reap_sends(events, false);
  }
  ep->drain_sends(events);
  return 0;
}

// ---- Bytes per second: messages of SIZE bytes flat out ----

/// Receives each side posts, and so the messages in flight: 8 MiB of them
/// (2 to 16).
std::uint32_t bulk_depth(std::size_t size) {
  return static_cast<std::uint32_t>(std::clamp<std::size_t>((8U << 20) / size, 2, 16));
}
constexpr std::size_t kCredit = 8;  // the relay's "a buffer is free again"

struct PdDeleter {
  void operator()(ibv_pd* pd) const { ibv_dealloc_pd(pd); }
};
struct ChannelDeleter {
  void operator()(ibv_comp_channel* c) const { ibv_destroy_comp_channel(c); }
};
struct CqDeleter {
  void operator()(ibv_cq* cq) const { ibv_destroy_cq(cq); }
};

int bulk_relay(const char* addr, const char* port, std::size_t size) {
  const std::uint32_t depth = bulk_depth(size);
  const Listener listener = listen_on(addr, port, nullptr);
  // One PD, so that a buffer the publisher's message arrived in is sent on
  // to the subscriber as it is; one CQ with its channel for both QPs, as a
  // broker's worker has. Declared first: they go after the endpoints (QP
  // and MR before CQ and PD).
  std::unique_ptr<ibv_pd, PdDeleter> pd;
  std::unique_ptr<ibv_comp_channel, ChannelDeleter> channel;
  std::unique_ptr<ibv_cq, CqDeleter> cq;
  std::unique_ptr<Endpoint> sub, pub;
  while (!sub || !pub) {
    char role = 0;
    rdma_cm_id* id = next_request(listener.get(), role);
    if (!pd) {
      pd.reset(ibv_alloc_pd(id->verbs));
      channel.reset(ibv_create_comp_channel(id->verbs));
      if (!pd || !channel) die("ibv_alloc_pd / ibv_create_comp_channel");
      cq.reset(ibv_create_cq(id->verbs, static_cast<int>(4 * depth + 8), nullptr, channel.get(), 0));
      if (!cq) die("ibv_create_cq");
    }
    ibv_qp_init_attr attr = qp_attributes(depth, depth);
    attr.send_cq = attr.recv_cq = cq.get();
    if (rdma_create_qp(id, pd.get(), &attr) != 0) die("rdma_create_qp");
    // The publisher's side holds the buffers (and the credits sent back);
    // the subscriber's sends from them.
    auto ep = std::make_unique<Endpoint>(
        id, role == kSubscriber ? Shape{0, 0, 0, 0} : Shape{size, depth, kCredit, depth});
    if (role != kSubscriber) ep->post_all_recvs();
    rdma_conn_param p = connection_parameters(nullptr);
    if (rdma_accept(id, &p) != 0) die("rdma_accept");
    ep->set_connected();
    (role == kSubscriber ? sub : pub) = std::move(ep);
  }
  const std::uint32_t pub_qp = pub->id()->qp->qp_num;
  std::uint64_t credits = 0;
  std::uint32_t credits_inflight = 0, forwards_inflight = 0;
  bool ended = false;
  while (!ended || forwards_inflight > 0 || credits_inflight > 0) {
    std::array<ibv_wc, 16> wcs{};
    int n = ibv_poll_cq(cq.get(), static_cast<int>(wcs.size()), wcs.data());
    if (n == 0) {
      // Armed, then polled once more (a completion that came in between
      // raises no event), then asleep until the next.
      if (ibv_req_notify_cq(cq.get(), 0) != 0) die("ibv_req_notify_cq");
      n = ibv_poll_cq(cq.get(), static_cast<int>(wcs.size()), wcs.data());
      if (n == 0) {
        ibv_cq* ev_cq = nullptr;
        void* ev_ctx = nullptr;
        if (ibv_get_cq_event(channel.get(), &ev_cq, &ev_ctx) != 0) die("ibv_get_cq_event");
        ibv_ack_cq_events(ev_cq, 1);
        continue;
      }
    }
    if (n < 0) die("ibv_poll_cq");
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<std::size_t>(i)];
      if (wc.status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "raw_relay: completion: %s\n", ibv_wc_status_str(wc.status));
        std::exit(1);
      }
      const auto slot = static_cast<std::uint64_t>(wc.wr_id);
      if (wc.opcode == IBV_WC_RECV) {  // a message: on to the subscriber from where it landed
        Stamp stamp;
        std::memcpy(&stamp, pub->recv_slot(slot), sizeof stamp);
        ended = ended || stamp.seq == kEnd;
        sub->send_from(pub->recv_slot(slot), wc.byte_len, pub->recv_mr(), slot);
        ++forwards_inflight;
      } else if (wc.qp_num == pub_qp) {  // a credit the publisher has
        pub->sent();
        --credits_inflight;
      } else {  // the subscriber has it: the buffer takes the next, and says so
        sub->sent();
        --forwards_inflight;
        pub->post_recv(slot);
        pub->send_from(pub->send_slot(credits++), kCredit, pub->send_mr(), 0);
        ++credits_inflight;
      }
    }
  }
  return 0;
}

int bulk_subscribe(const char* addr, const char* port, const char* bind, std::size_t size,
                   std::uint64_t count) {
  auto ep = dial(addr, port, bind, "S", Shape{size, bulk_depth(size), 0, 0});
  std::printf("sub: connected\n");
  std::fflush(stdout);
  std::uint64_t messages = 0, bytes = 0;
  std::int64_t start = 0, last = 0;
  for (;;) {
    const auto [wc, now, stamp] = ep->receive_message(true);
    if (stamp.seq == kEnd) break;
    ++messages;
    bytes += wc.byte_len;
    start = stamp.scheduled_ns;  // the publisher's start, in every message
    last = now;
  }
  const double seconds = static_cast<double>(last - start) / 1e9;
  std::printf("messages %llu of %llu, %zu bytes each, in %.3f s\n", static_cast<unsigned long long>(messages),
              static_cast<unsigned long long>(count), size, seconds);
  std::printf("seconds %.3f\n", seconds);
  std::printf("mb_per_s %.1f\n", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0);
  return messages == count ? 0 : 1;
}

int bulk_publish(const char* addr, const char* port, const char* bind, std::size_t size,
                 std::uint64_t count) {
  const std::uint32_t depth = bulk_depth(size);
  auto ep = dial(addr, port, bind, "P", Shape{kCredit, depth, size, depth});
  std::uint32_t credits = depth;  // the relay's buffers, each posted for us
  const auto take_credits = [&](bool wait) {
    ibv_wc wc{};
    if (wait) {
      wc = ep->next_recv(true);
      ep->post_recv(static_cast<std::uint64_t>(wc.wr_id));
      ++credits;
    }
    while (ep->try_recv(wc)) {
      ep->post_recv(static_cast<std::uint64_t>(wc.wr_id));
      ++credits;
    }
  };
  const std::int64_t start = now_ns();
  for (std::uint64_t seq = 0; seq <= count; ++seq) {
    take_credits(credits == 0);
    --credits;
    Stamp stamp;
    stamp.seq = seq == count ? kEnd : seq;
    stamp.scheduled_ns = start;
    stamp.posted_ns = now_ns();
    std::memcpy(ep->send_slot(seq), &stamp, sizeof stamp);
    ep->send(seq, true, seq == count ? sizeof stamp : size);
    ep->reap_sends(true, false);
  }
  // Gone only when the relay has every buffer back: it sends on to the
  // subscriber what it holds, and its credits need us to arrive.
  while (credits < depth) take_credits(true);
  ep->drain_sends(true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  const bool events = argc > 4 && std::string(argv[4]) == "events";
  if (role.rfind("bulk-", 0) != 0 && argc > 4 && !events && std::string(argv[4]) != "polled") {
    std::fprintf(stderr, "raw_relay: MODE is events or polled\n");
    return 2;
  }
  if (role == "bulk-relay" && argc == 5)
    return bulk_relay(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10));
  if ((role == "bulk-sub" || role == "bulk-pub") && argc == 7) {
    const std::size_t size = std::strtoull(argv[5], nullptr, 10);
    const std::uint64_t count = std::strtoull(argv[6], nullptr, 10);
    if (size < sizeof(Stamp) || count == 0) {
      std::fprintf(stderr, "raw_relay: SIZE is at least %zu bytes, COUNT at least 1\n", sizeof(Stamp));
      return 2;
    }
    return role == "bulk-sub" ? bulk_subscribe(argv[2], argv[3], argv[4], size, count)
                              : bulk_publish(argv[2], argv[3], argv[4], size, count);
  }
  if (role == "relay" && argc == 5) return relay(argv[2], argv[3], events);
  if (role == "sub" && argc == 6) return subscribe(argv[2], argv[3], events, argv[5]);
  if (role == "pub" && argc == 8)
    return publish(argv[2], argv[3], events, argv[5], std::atof(argv[6]), std::atof(argv[7]));
  std::fprintf(stderr,
               "usage: raw_relay relay ADDR PORT MODE\n"
               "       raw_relay sub ADDR PORT MODE BIND\n"
               "       raw_relay pub ADDR PORT MODE BIND RATE SECONDS\n"
               "       raw_relay bulk-relay ADDR PORT SIZE\n"
               "       raw_relay bulk-sub ADDR PORT BIND SIZE COUNT\n"
               "       raw_relay bulk-pub ADDR PORT BIND SIZE COUNT\n");
  return 2;
}
