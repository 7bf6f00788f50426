// SPDX-License-Identifier: Apache-2.0
// The floor a broker's relay is measured against (issue 47): three processes,
// publisher -> relay -> subscriber, on raw verbs and rdma_cm (RC, 64-byte
// SENDs into pre-posted receives), no framing, no routing, no credits. The
// relay forwards each message as it arrives. Everything else is what
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
// Run by tests/bench/raw-relay.sh.
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <time.h>

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

/// One endpoint: its cm_id with QP and CQs (rdma_create_ep), and the buffers
/// its receives and sends use, registered with its PD. The region goes
/// before the endpoint (MR before PD and QP); the endpoint takes its QP,
/// CQs and cm_id with it, the cm_id last.
class Endpoint {
 public:
  explicit Endpoint(rdma_cm_id* id) : id_(id), buffers_(2 * kDepth * kMessage) {
    mr_ = rdma_reg_msgs(id_, buffers_.data(), buffers_.size());
    if (mr_ == nullptr) die("rdma_reg_msgs");
  }
  ~Endpoint() {
    if (connected_) rdma_disconnect(id_);
    rdma_dereg_mr(mr_);
    rdma_destroy_ep(id_);
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  rdma_cm_id* id() const { return id_; }
  void set_connected() { connected_ = true; }
  std::byte* recv_slot(std::uint64_t i) { return buffers_.data() + i * kMessage; }
  std::byte* send_slot(std::uint64_t i) { return buffers_.data() + (kDepth + i % kDepth) * kMessage; }

  void post_recv(std::uint64_t slot) {
    if (rdma_post_recv(id_, reinterpret_cast<void*>(slot), recv_slot(slot), kMessage, mr_) != 0)
      die("rdma_post_recv");
  }
  void post_all_recvs() {
    for (std::uint64_t i = 0; i < kDepth; ++i) post_recv(i);
  }
  /// Sends send slot `n`; waits for a free slot when kDepth are in flight.
  void send(std::uint64_t n, bool events) {
    while (inflight_ >= kDepth) reap_sends(events, true);
    if (rdma_post_send(id_, nullptr, send_slot(n), kMessage, mr_, IBV_SEND_SIGNALED) != 0)
      die("rdma_post_send");
    ++inflight_;
  }
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
  rdma_cm_id* id_;
  std::vector<std::byte> buffers_;  // kDepth receive slots, then kDepth send slots
  ibv_mr* mr_ = nullptr;
  std::uint32_t inflight_ = 0;
  bool connected_ = false;
};

ibv_qp_init_attr qp_attributes() {
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = kDepth;
  attr.cap.max_recv_wr = kDepth;
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
std::unique_ptr<Endpoint> dial(const char* addr, const char* port, const char* bind, const char* role) {
  const AddrInfo ai = resolve(addr, port, false, bind);
  ibv_qp_init_attr attr = qp_attributes();
  rdma_cm_id* id = nullptr;
  if (rdma_create_ep(&id, ai.get(), nullptr, &attr) != 0) die("rdma_create_ep");
  auto ep = std::make_unique<Endpoint>(id);
  ep->post_all_recvs();
  rdma_conn_param p = connection_parameters(role);
  if (rdma_connect(id, &p) != 0) die("rdma_connect");
  ep->set_connected();
  return ep;
}

int relay(const char* addr, const char* port, bool events) {
  const AddrInfo ai = resolve(addr, port, true, nullptr);
  ibv_qp_init_attr attr = qp_attributes();
  rdma_cm_id* listen_id = nullptr;
  if (rdma_create_ep(&listen_id, ai.get(), nullptr, &attr) != 0) die("rdma_create_ep (listen)");
  std::unique_ptr<rdma_cm_id, void (*)(rdma_cm_id*)> listener(listen_id, rdma_destroy_ep);
  if (rdma_listen(listen_id, 2) != 0) die("rdma_listen");
  std::printf("relay: listening\n");
  std::fflush(stdout);
  std::unique_ptr<Endpoint> sub, pub;
  while (!sub || !pub) {
    rdma_cm_id* id = nullptr;
    if (rdma_get_request(listen_id, &id) != 0) die("rdma_get_request");
    const auto& conn = id->event->param.conn;
    const char role = conn.private_data_len >= 1 ? *static_cast<const char*>(conn.private_data) : '?';
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
    const ibv_wc wc = ep->next_recv(events);
    const std::int64_t now = now_ns();
    const auto slot = static_cast<std::uint64_t>(wc.wr_id);
    Stamp stamp;
    std::memcpy(&stamp, ep->recv_slot(slot), sizeof stamp);
    ep->post_recv(slot);
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

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  const bool events = argc > 4 && std::string(argv[4]) == "events";
  if (argc > 4 && !events && std::string(argv[4]) != "polled") {
    std::fprintf(stderr, "raw_relay: MODE is events or polled\n");
    return 2;
  }
  if (role == "relay" && argc == 5) return relay(argv[2], argv[3], events);
  if (role == "sub" && argc == 6) return subscribe(argv[2], argv[3], events, argv[5]);
  if (role == "pub" && argc == 8)
    return publish(argv[2], argv[3], events, argv[5], std::atof(argv[6]), std::atof(argv[7]));
  std::fprintf(stderr,
               "usage: raw_relay relay ADDR PORT MODE\n"
               "       raw_relay sub ADDR PORT MODE BIND\n"
               "       raw_relay pub ADDR PORT MODE BIND RATE SECONDS\n");
  return 2;
}
