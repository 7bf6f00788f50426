// SPDX-License-Identifier: Apache-2.0
// Broker counters. Each worker owns one WorkerStats and is its only writer
// (relaxed atomics so the admin thread can read without locks).
//
// Every statistic is declared once, by the component that keeps it, in its
// visit() (WorkerStats::visit here, MulticastStats::visit, Server::visit_stats,
// Reloader::visit_stats): its key in the snapshot (the admin socket's `stats`,
// `rdmabroker stat --json`) and, when exported, its Prometheus family, help
// and label. The snapshot (StatsSnapshotter) and the exporter (ops/metrics.cpp)
// are two visitors of the same declarations, so renaming a counter renames
// it everywhere, and no string joins them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "broker/close_reason.hpp"
#include "broker/pool_shares.hpp"

namespace rdmabroker::daemon {

/// A monotonically increasing count with a single writer.
class Counter {
 public:
  void add(std::uint64_t n = 1) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  std::uint64_t get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

/// A value that goes up and down, with a single writer.
class Gauge {
 public:
  void set(std::int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void add(std::int64_t n) { set(get() + n); }
  std::int64_t get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::int64_t> v_{0};
};

/// A fixed-bucket histogram with a single writer (Prometheus semantics:
/// buckets are upper bounds, exported cumulatively).
template <std::size_t N>
class Histogram {
 public:
  explicit constexpr Histogram(const std::array<double, N>& bounds) : bounds_(bounds) {}
  void observe(double v) {
    std::size_t i = 0;
    while (i < N && v > bounds_[i]) ++i;
    counts_[i].add();
    sum_.store(sum_.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  const std::array<double, N>& bounds() const { return bounds_; }
  std::uint64_t count(std::size_t i) const { return counts_[i].get(); }  // i == N: above the last bound
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::array<double, N> bounds_;
  std::array<Counter, N + 1> counts_;
  std::atomic<double> sum_{0};
};

/// Work completions returned by one ibv_poll_cq call that found any.
inline constexpr std::array<double, 7> kCompletionsPerPollBounds = {1, 2, 4, 8, 16, 24, 32};
/// Seconds from a message's arrival at the broker to the completed send that
/// carried it to a subscriber (the first message of each send).
inline constexpr std::array<double, 14> kRelayLatencyBounds = {
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 1.0};

/// A histogram summed over workers: counts per bucket (the last one above
/// every bound), not cumulative.
struct HistogramSnapshot {
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;
  double sum = 0;
  template <std::size_t N>
  void add(const Histogram<N>& h) {
    if (bounds.empty()) {
      bounds.assign(h.bounds().begin(), h.bounds().end());
      counts.assign(N + 1, 0);
    }
    for (std::size_t i = 0; i <= N; ++i) counts[i] += h.count(i);
    sum += h.sum();
  }
  /// Adds another snapshot with the same bounds (false, unchanged, if they differ).
  bool merge(const HistogramSnapshot& o) {
    if (bounds.empty()) {
      *this = o;
      return true;
    }
    if (o.bounds != bounds) return false;
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
    sum += o.sum;
    return true;
  }
};

/// One statistic as declared by the component that keeps it.
struct StatInfo {
  /// Its name in the snapshot, e.g. "messages.in"; empty: exported only (a
  /// second series of a value that the snapshot already has under another key).
  std::string key;
  /// Its Prometheus family, e.g. "rdmabroker_messages_received_total"; empty:
  /// in the snapshot only. Series of one family share its help, kind and label.
  std::string_view metric = {};
  std::string_view help = {};
  /// The family's label name ("reason") and this series' value of it.
  std::string_view label = {};
  std::string label_value = {};
  /// What the exported series is the snapshot's value times: 1e-3 exports a
  /// snapshot's milliseconds in the seconds Prometheus wants.
  double export_scale = 1;
};

/// A Prometheus family whose series more than one component declares.
struct StatFamily {
  std::string_view metric;
  std::string_view help;
  std::string_view label = {};
  /// One series of the family: snapshot key `key`, label value `label_value`.
  StatInfo series(std::string key, std::string label_value = {}) const {
    return {std::move(key), metric, help, label, std::move(label_value)};
  }
};
/// Refusals by limit: the workers count most, Admission the connection limit.
inline constexpr StatFamily kLimitRefusals{"rdmabroker_limit_refusals_total",
                                           "Operations refused by a configured limit, by limit.", "limit"};

/// What the snapshot and the exporter implement: called once per statistic
/// per component (per worker for WorkerStats: a visitor sums equal keys).
class StatsVisitor {
 public:
  virtual ~StatsVisitor() = default;
  virtual void counter(const StatInfo& info, std::uint64_t value) = 0;
  virtual void gauge(const StatInfo& info, std::int64_t value) = 0;
  virtual void histogram(const StatInfo& info, const HistogramSnapshot& value) = 0;

  /// Shorthands for a statistic without a label (no metric: the snapshot only).
  void count(std::string key, const Counter& c, std::string_view metric = {}, std::string_view help = {}) {
    counter({std::move(key), metric, help}, c.get());
  }
  void level(std::string key, std::int64_t value, std::string_view metric = {}, std::string_view help = {}) {
    gauge({std::move(key), metric, help}, value);
  }
};

/// Sum of every component's statistics: name -> value.
using StatsSnapshot = std::map<std::string, std::int64_t>;

/// The snapshot as a visitor: sums counters and gauges by key; histograms and
/// exported-only series (no key) are not in it.
class StatsSnapshotter final : public StatsVisitor {
 public:
  void counter(const StatInfo& info, std::uint64_t value) override {
    if (!info.key.empty()) snapshot[info.key] += static_cast<std::int64_t>(value);
  }
  void gauge(const StatInfo& info, std::int64_t value) override {
    if (!info.key.empty()) snapshot[info.key] += value;
  }
  void histogram(const StatInfo&, const HistogramSnapshot&) override {}
  StatsSnapshot snapshot;
};

/// Why a worker's blocking wait returned: its wake-ups, the unit cost of
/// latency on an idle core (issue 16's budget counts them per message).
enum class WakeCause : unsigned char {
  kCompletion,  // a completion channel: a receive or send completed
  kCommand,     // the command queue's eventfd: another thread handed work over
  kSocket,      // a TCP socket or the listening socket
  kCm,          // an rdma_cm event
  kTimer,       // nothing: the wait's timeout (deadline checks)
  kCount,
};
inline constexpr std::size_t kWakeCauseCount = static_cast<std::size_t>(WakeCause::kCount);
constexpr std::string_view to_string(WakeCause c) {
  switch (c) {
    case WakeCause::kCompletion:
      return "completion";
    case WakeCause::kCommand:
      return "command";
    case WakeCause::kSocket:
      return "socket";
    case WakeCause::kCm:
      return "cm";
    case WakeCause::kTimer:
      return "timer";
    case WakeCause::kCount:
      break;
  }
  return "unknown";
}

struct WorkerStats {
  /// Declares every statistic below to `v` (stats.cpp).
  void visit(StatsVisitor& v) const;

  Histogram<kCompletionsPerPollBounds.size()> completions_per_poll{kCompletionsPerPollBounds};
  Histogram<kRelayLatencyBounds.size()> relay_latency{kRelayLatencyBounds};
  Counter connections_accepted;                               // handshakes completed on this worker
  std::array<Counter, kCloseReasonCount> connections_closed;  // by CloseReason
  Gauge connections_current;                                  // open on this worker, any state
  Counter messages_in;                                        // PUBLISH frames accepted
  Counter bytes_in;                                           // their payload bytes
  Counter messages_no_subscribers;                            // PUBLISH with nobody subscribed (not a drop)
  Counter routed;                                 // deliveries queued for subscribers (fan-out count)
  Counter deliveries;                             // DELIVER frames whose SEND completed successfully
  Counter bytes_out;                              // their payload bytes
  Counter route_deliveries;                       // ... of them to other brokers' routes (cluster)
  Counter route_bytes_out;                        // their payload bytes
  std::array<Counter, kDropReasonCount> dropped;  // accepted, not delivered, by DropReason
  Counter protocol_errors;                        // ERROR frames sent for bad input
  Counter sends_posted;                           // SEND work requests posted
  Counter frames_sent;                            // frames in those SENDs (frames/sends = batching)
  Counter credit_updates;                         // zero-byte SENDs that only return credits
  Counter credit_stalls;                          // flushes that had data but no send credit
  Counter producer_stalls;                        // publishers slowed because a subscriber was backlogged
  Counter receives;                               // receive completions
  Counter orphan_receives;                        // receives for a QP that was already gone
  Counter wc_errors;                              // completions with an error status other than flush
  Counter rendezvous_offers;                      // RDV_OFFERs accepted (SPEC.md §3.8)
  Counter rendezvous_reads;                       // RDMA READ work requests posted for them
  Counter rendezvous_bytes;                       // bytes those READs brought
  Counter rendezvous_read_errors;                 // READs that failed (the publisher's region unreadable)
  Counter landing_areas;                          // RDV_READYs taken: landing areas named (SPEC.md §3.9)
  Counter landing_writes;                         // RDMA WRITE work requests posted into them
  Counter landing_bytes;                          // bytes those WRITEs carried
  Counter landing_write_errors;                   // WRITEs that failed (the subscriber's area unwritable)
  Counter srq_refills;                            // SRQ refills at the low watermark
  Counter srq_limit_events;                       // IBV_EVENT_SRQ_LIMIT_REACHED: a refill batch or less left
  Counter pool_exhausted;   // times a worker found the buffer pool empty (once per shortage)
  Counter cq_full;          // connections refused because their CQ had no room for them
  Gauge srq_posted;         // receives posted on this worker's SRQs
  Gauge credits_granted;    // the credit windows of this worker's RDMA connections (SPEC.md §5.1)
  Gauge credit_capacity;    // what those windows may add up to: the SRQs' bound (RdmaPort::srq_max)
  Counter credit_reclaims;  // idle version-3 connections asked to give credits back
  Counter credit_refusals;  // RDMA connections refused because their port's windows were full
  Gauge pending_messages;   // queued for subscribers, not yet posted
  Gauge pending_bytes;      // their frame bytes (limits.max_pending_bytes_total bounds the sum)
  // The same charge (queued_charge) of deliveries on their way between
  // workers: routed here for another worker's subscriber (out), or taken
  // here from another worker (in). Their sums' difference is what the
  // workers' pending_* do not count yet (WorkerSet::pending_charge_total).
  Counter transit_charge_out;
  Counter transit_charge_in;
  Gauge queue_pins;            // pool buffers those queues hold (broker/pool_shares.hpp)
  Counter compacted_messages;  // waiting messages copied out of their receive buffers (Connections::compact)
  std::array<Counter, kShareScopeCount> share_cuts;  // subscribers cut above a pool share, by ShareScope
  Counter accept_failures;                           // connections handed over but never accepted
  Counter no_responders;      // requests (PUBLISH with REQUEST flag) nobody was subscribed to
  Counter headers_stripped;   // messages delivered without their header block to version-1 clients
  Gauge tcp_connections;      // TCP connections open on this worker
  Counter tcp_reads;          // read() calls that returned data
  Counter tcp_writes;         // sendmsg() calls that wrote data
  Counter tcp_write_blocked;  // writes that hit a full socket buffer (EAGAIN)
  Gauge tls_connections;      // TLS connections open on this worker (counted in tcp_connections too)
  Counter tls_handshakes;     // TLS handshakes completed
  std::array<Counter, 6> tls_failures;  // TLS handshakes failed, by TlsFailure (tcp/tcp_port.hpp)
  Counter tls_plain_refused;            // plain TCP connect requests refused by tls.mode: required
  Counter limit_payload;  // PUBLISH frames over limits.max_payload or the buffer size (connection closed)
  Counter limit_subscriptions;  // SUBSCRIBE frames over limits.max_subscriptions (ERROR, connection stays)
  Counter limit_subscriptions_total;       // ... over limits.max_subscriptions_total (broker-wide)
  Counter limit_consumer_opens;            // CONSUMEs over limits.consumer_opens_per_second (ERROR, stays)
  Counter limit_subscription_memory;       // ... over limits.max_subscription_memory (broker-wide)
  Counter limit_user_subscriptions;        // ... over the tenant's part of max_subscriptions_total
  Counter limit_user_subscription_memory;  // ... over the tenant's part of max_subscription_memory
  Counter limit_pending_total;    // subscribers cut off above their share of limits.max_pending_bytes_total
  Counter auth_ok;                // connections authenticated (anonymous included)
  Counter auth_failed;            // refused credentials, missing CONNECT, or too late
  Counter denied_publish;         // PUBLISH frames refused by permissions (ERROR sent)
  Counter denied_subscribe;       // SUBSCRIBE frames refused by permissions (ERROR sent)
  Counter subscriptions_revoked;  // subscriptions removed because a reload took the permission away
  std::array<Counter, kWakeCauseCount> wakeups;  // blocking waits that returned, by what ended them
  Counter spins_found;                           // busy or adaptive polls that found work (no wake-up)
  Counter spins_empty;                           // ... that ran out without any
  Counter handoffs_direct;  // deliveries from another thread made while this worker slept (no wake-up)
  Counter handoffs_queued;  // DeliverCommands this worker took from its queue (woke it if it slept)
};

}  // namespace rdmabroker::daemon
