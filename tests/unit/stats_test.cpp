// SPDX-License-Identifier: Apache-2.0
// The statistics are declared once (broker/stats.hpp): the snapshot and the
// Prometheus exporter are two visitors of the same declarations. These tests
// pin down that the two agree, that workers are summed, and that a family
// declared two different ways is caught.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "broker/admission.hpp"
#include "broker/stats.hpp"
#include "multicast/engine.hpp"
#include "ops/metrics.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {
namespace {

std::size_t index_of(CloseReason r) { return static_cast<std::size_t>(r); }

/// Two workers and a multicast engine with some of everything counted.
struct Components {
  WorkerStats a, b;
  MulticastStats multicast;
  ConnectionSlots slots{1};
  Admission admission{slots, 1, 4096};
  Components() {
    // Refusals of both transports land in one set of counters.
    admission.refuse(Admission::Via::kTcp, "peer", "bad magic", proto::RejectReason::kBadMagic);
    admission.refuse(Admission::Via::kTcp, "peer", "closed during the handshake", std::nullopt);
    admission.refuse(Admission::Via::kRdma, "peer", "bad magic", proto::RejectReason::kBadMagic);
    proto::RejectReason why{};
    std::optional<Admission::Eviction> evict;
    EXPECT_TRUE(admission.reserve(false, {1, 0, "10.0.0.1:5000"}, why, evict));
    EXPECT_FALSE(admission.reserve(false, {2, 0, "10.0.0.2:5000"}, why, evict));  // over the limit of one
    EXPECT_EQ(why, proto::RejectReason::kTooManyConnections);
    EXPECT_FALSE(admission.reserve(true, {3, 0, "10.0.0.3:5000"}, why,
                                   evict));  // shutting down: refused, not over a limit
    EXPECT_EQ(why, proto::RejectReason::kShuttingDown);
    a.messages_in.add(3);
    b.messages_in.add(4);
    a.connections_closed[index_of(CloseReason::kSlowConsumer)].add(1);
    b.connections_closed[index_of(CloseReason::kSlowConsumer)].add(2);
    a.connections_current.set(5);
    a.tcp_connections.set(2);
    b.connections_current.set(1);
    b.limit_payload.add(1);
    a.pending_bytes.set(1000);
    a.pending_messages.set(2);
    a.relay_latency.observe(20e-6);
    b.relay_latency.observe(2.0);
    multicast.channels.set(1);
    multicast.repairs_served.add(9);
  }
  void visit(StatsVisitor& v) const {
    a.visit(v);
    b.visit(v);
    multicast.visit(v);
    admission.visit(v);
  }
};

const prometheus::MetricFamily* family(const MetricFamilies& m, const std::string& name) {
  for (const auto& f : m.families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(Stats, TheSnapshotSumsWorkersByKey) {
  Components c;
  StatsSnapshotter s;
  c.visit(s);
  EXPECT_EQ(s.snapshot["messages.in"], 7);
  EXPECT_EQ(s.snapshot["connections.closed.slow_consumer"], 3);
  EXPECT_EQ(s.snapshot["connections.current"], 6);
  EXPECT_EQ(s.snapshot["connections.by_transport.tcp"], 2);
  EXPECT_EQ(s.snapshot["connections.by_transport.rdma"], 4);
  EXPECT_EQ(s.snapshot["tcp.rejected"], 2);
  EXPECT_EQ(s.snapshot["connections.rejected"], 3);
  EXPECT_EQ(s.snapshot["limits.refused.connections"], 1);
  EXPECT_EQ(s.snapshot["limits.refused.payload"], 1);
  EXPECT_EQ(s.snapshot["messages.pending_charge"], queued_charge(1000, 2));
  EXPECT_EQ(s.snapshot["multicast.repairs_served"], 9);
  // A series exported under a second name is not counted twice.
  EXPECT_FALSE(s.snapshot.contains(""));
}

TEST(Stats, TheExporterAndTheSnapshotReadTheSameDeclarations) {
  Components c;
  const MetricFamilies m = collect_metric_families([&](StatsVisitor& v) { c.visit(v); });
  for (const auto& e : m.errors) ADD_FAILURE() << e;
  std::set<std::string> names;
  for (const auto& f : m.families) EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";

  // Every exported series has the value its snapshot key has.
  struct Recorder final : StatsVisitor {
    std::vector<StatInfo> exported;
    void counter(const StatInfo& i, std::uint64_t) override { keep(i); }
    void gauge(const StatInfo& i, std::int64_t) override { keep(i); }
    void histogram(const StatInfo&, const HistogramSnapshot&) override {}
    void keep(const StatInfo& i) {
      if (!i.metric.empty() && !i.key.empty()) exported.push_back(i);
    }
  } recorder;
  c.visit(recorder);
  StatsSnapshotter s;
  c.visit(s);
  ASSERT_GT(recorder.exported.size(), 50u);
  for (const auto& info : recorder.exported) {
    const auto* f = family(m, std::string(info.metric));
    ASSERT_NE(f, nullptr) << info.metric;
    bool found = false;
    for (const auto& series : f->metric) {
      if (!info.label.empty() && series.label.at(0).value != info.label_value) continue;
      const double v = f->type == prometheus::MetricType::Counter ? series.counter.value : series.gauge.value;
      EXPECT_EQ(v, static_cast<double>(s.snapshot.at(info.key))) << info.metric << " " << info.key;
      found = true;
    }
    EXPECT_TRUE(found) << info.metric << " has no series for " << info.key;
  }

  // Labelled families have a series per value, the second name of a value too.
  const auto* closed = family(m, "rdmabroker_connections_closed_total");
  ASSERT_NE(closed, nullptr);
  EXPECT_EQ(closed->metric.size(), kCloseReasonCount);
  const auto* slow = family(m, "rdmabroker_slow_consumers_total");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->metric.at(0).counter.value, 3);
  // Histograms are merged over workers.
  const auto* latency = family(m, "rdmabroker_relay_latency_seconds");
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->type, prometheus::MetricType::Histogram);
  EXPECT_EQ(latency->metric.at(0).histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(latency->metric.at(0).histogram.sample_sum, 2.0 + 20e-6);
  EXPECT_NE(family(m, "rdmabroker_build_info"), nullptr);
}

TEST(Stats, AFamilyDeclaredTwoWaysIsReported) {
  const MetricFamilies m = collect_metric_families([](StatsVisitor& v) {
    v.counter({"x.a", "rdmabroker_x_total", "X."}, 1);
    v.gauge({"x.b", "rdmabroker_x_total", "X."}, 1);                   // another kind
    v.counter({"x.c", "rdmabroker_x_total", "Not X."}, 1);             // another help
    v.counter({"x.d", "rdmabroker_x_total", "X.", "reason", "d"}, 1);  // another label
    v.counter({"x.a", "rdmabroker_x_total", "X."}, 2);                 // fine: summed
  });
  EXPECT_EQ(m.errors.size(), 3u);
  const auto* x = family(m, "rdmabroker_x_total");
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(x->metric.size(), 1u);
  EXPECT_EQ(x->metric[0].counter.value, 3);
}

}  // namespace
}  // namespace rdmabroker::daemon
