#include "ops/metrics.hpp"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <vector>

#include "rdmabroker/config/config.hpp"
#include "tcp/tcp_listener.hpp"

namespace rdmabroker::daemon {

namespace {

/// A whole HTTP/1.0-style response; the connection closes after it.
std::string http_response(int status, const char* reason, const char* type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

/// One exported metric. `key` is a counter name of Broker::stats(); with a
/// `label`, `key` is a prefix and every counter under it becomes one series
/// labelled with the rest of its name (e.g. connections.closed.slow_consumer
/// -> reason="slow_consumer").
struct MetricDef {
  const char* name;
  MetricType type;
  const char* help;
  const char* key;
  const char* label = nullptr;
};

constexpr MetricType kCounter = MetricType::Counter;
constexpr MetricType kGauge = MetricType::Gauge;

// The broker's metrics, in one place.
const MetricDef kMetrics[] = {
    {"rdmabroker_connections", kGauge, "Open client connections, by transport.", "connections.by_transport.",
     "transport"},
    {"rdmabroker_connections_accepted_total", kCounter, "Connections that completed their handshake.",
     "connections.accepted"},
    {"rdmabroker_connections_rejected_total", kCounter, "Connection attempts refused in the handshake.",
     "connections.rejected"},
    {"rdmabroker_connections_closed_total", kCounter, "Connections closed, by close reason.",
     "connections.closed.", "reason"},
    {"rdmabroker_messages_received_total", kCounter, "PUBLISH frames accepted from clients.", "messages.in"},
    {"rdmabroker_received_bytes_total", kCounter, "Payload bytes of accepted PUBLISH frames.", "bytes.in"},
    {"rdmabroker_messages_routed_total", kCounter, "Copies of messages queued for subscribers (fan-out).",
     "messages.routed"},
    {"rdmabroker_messages_delivered_total", kCounter, "Messages sent to subscribers (send completed).",
     "messages.delivered"},
    {"rdmabroker_delivered_bytes_total", kCounter, "Payload bytes of delivered messages.", "bytes.out"},
    {"rdmabroker_messages_dropped_total", kCounter,
     "Routed messages not delivered, by the policy that dropped them.", "messages.dropped.", "reason"},
    {"rdmabroker_messages_no_subscribers_total", kCounter,
     "Messages published to a subject nobody subscribes to.", "messages.no_subscribers"},
    {"rdmabroker_requests_no_responders_total", kCounter, "Requests answered with NO_RESPONDERS.",
     "messages.no_responders"},
    {"rdmabroker_messages_pending", kGauge, "Messages queued for subscribers and not yet sent.",
     "messages.pending"},
    {"rdmabroker_slow_consumers_total", kCounter, "Subscribers disconnected as slow consumers.",
     "connections.closed.slow_consumer"},
    {"rdmabroker_subscriptions", kGauge, "Active subscriptions.", "subscriptions"},
    {"rdmabroker_subscription_memory_bytes", kGauge,
     "Estimated heap held by subscriptions (limits.max_subscription_memory bounds it).",
     "subscriptions.memory_bytes"},
    {"rdmabroker_pending_bytes", kGauge, "Frame bytes queued for subscribers, all connections.",
     "messages.pending_bytes"},
    {"rdmabroker_pending_charged_bytes", kGauge,
     "Queued frame bytes plus 128 bytes of bookkeeping per queued message: what "
     "limits.max_pending_bytes_total bounds.",
     "messages.pending_charge"},
    {"rdmabroker_protocol_errors_total", kCounter, "Connections closed for a protocol error.",
     "protocol_errors"},
    {"rdmabroker_credit_stalls_total", kCounter,
     "Flushes that had data for an RDMA client but no send credit.", "rdma.credit_stalls"},
    {"rdmabroker_credit_updates_total", kCounter, "Zero-byte SENDs that only returned credits.",
     "rdma.credit_updates"},
    {"rdmabroker_producer_stalls_total", kCounter,
     "Publishers slowed because a subscriber they feed was backlogged.", "producer_stalls"},
    {"rdmabroker_rdma_sends_total", kCounter, "RDMA SEND work requests posted.", "rdma.sends_posted"},
    {"rdmabroker_rdma_receives_total", kCounter, "RDMA receive completions.", "rdma.receives"},
    {"rdmabroker_rdma_orphan_receives_total", kCounter, "Receives for a QP that was already gone.",
     "rdma.orphan_receives"},
    {"rdmabroker_rdma_work_completion_errors_total", kCounter,
     "Work completions with an error status (other than flush).", "rdma.wc_errors"},
    {"rdmabroker_srq_posted_receives", kGauge, "Receives posted on the shared receive queues.",
     "rdma.srq_posted"},
    {"rdmabroker_srq_refills_total", kCounter, "Shared receive queue refills at the low watermark.",
     "rdma.srq_refills"},
    {"rdmabroker_pool_buffers", kGauge, "Buffers in the registered pool.", "pool.buffers"},
    {"rdmabroker_pool_buffers_in_use", kGauge, "Pool buffers posted, queued or being sent.", "pool.in_use"},
    {"rdmabroker_pool_exhausted_total", kCounter,
     "Times a worker found the buffer pool empty (once per shortage).", "pool.exhausted"},
    {"rdmabroker_cq_full_refusals_total", kCounter,
     "RDMA connections refused because their completion queue had no room.", "rdma.cq_full"},
    {"rdmabroker_tcp_reads_total", kCounter, "read() calls on TCP connections that returned data.",
     "tcp.reads"},
    {"rdmabroker_tcp_writes_total", kCounter, "sendmsg() calls on TCP connections that wrote data.",
     "tcp.writes"},
    {"rdmabroker_tcp_write_blocked_total", kCounter, "TCP writes that found the socket buffer full.",
     "tcp.write_blocked"},
    {"rdmabroker_limit_refusals_total", kCounter, "Operations refused by a configured limit, by limit.",
     "limits.refused.", "limit"},
    {"rdmabroker_authentications_total", kCounter, "Connections that presented credentials, by outcome.",
     "auth.", "outcome"},
    {"rdmabroker_permission_denied_total", kCounter,
     "Publishes and subscriptions refused by the user's permissions.", "permissions.denied.", "operation"},
    {"rdmabroker_subscriptions_revoked_total", kCounter,
     "Subscriptions removed because a reload took the permission away.", "permissions.revoked"},
    {"rdmabroker_multicast_channels", kGauge,
     "Subjects served by a multicast channel (sequenced, repairable).", "multicast.channels"},
    {"rdmabroker_multicast_groups", kGauge, "Channels sending to a multicast group.", "multicast.groups"},
    {"rdmabroker_multicast_members", kGauge, "Subscriptions served by multicast channels.",
     "multicast.members"},
    {"rdmabroker_multicast_members_joined", kGauge, "Channel subscriptions receiving from their group.",
     "multicast.members_joined"},
    {"rdmabroker_multicast_messages_total", kCounter, "Messages sequenced by multicast channels.",
     "multicast.messages"},
    {"rdmabroker_multicast_group_messages_total", kCounter, "Channel messages sent to a multicast group.",
     "multicast.group_messages"},
    {"rdmabroker_multicast_datagrams_total", kCounter,
     "UD datagrams sent to multicast groups (fragments and heartbeats).", "multicast.datagrams"},
    {"rdmabroker_multicast_unicast_copies_total", kCounter,
     "Channel messages sent over RC to members not in the group.", "multicast.unicast_copies"},
    {"rdmabroker_multicast_repairs_requested_total", kCounter,
     "Multicast messages clients asked to have resent.", "multicast.repairs_requested"},
    {"rdmabroker_multicast_repairs_served_total", kCounter,
     "Multicast messages resent over RC from the retransmit window.", "multicast.repairs_served"},
    {"rdmabroker_multicast_unrecoverable_losses_total", kCounter,
     "Multicast messages beyond the retransmit window, reported lost to the client.", "multicast.losses"},
    {"rdmabroker_multicast_joins_total", kCounter, "Multicast groups joined by the broker (per device).",
     "multicast.joins"},
    {"rdmabroker_multicast_join_failures_total", kCounter,
     "Group joins by the broker that failed (the subject stays unicast).", "multicast.join_failures"},
    {"rdmabroker_multicast_client_join_failures_total", kCounter,
     "Subscriptions whose client could not join (served over RC).", "multicast.client_join_failures"},
    {"rdmabroker_multicast_send_errors_total", kCounter, "Multicast UD sends that failed.",
     "multicast.send_errors"},
    {"rdmabroker_reloads_total", kCounter, "Configuration reloads, by outcome.", "reloads.", "outcome"},
    {"rdmabroker_workers", kGauge, "Worker threads.", "workers"},
};

struct HistogramDef {
  const char* name;
  const char* help;
  const char* key;
};
const HistogramDef kHistograms[] = {
    {"rdmabroker_completions_per_poll", "Work completions returned by one ibv_poll_cq call that found any.",
     "completions_per_poll"},
    {"rdmabroker_relay_latency_seconds",
     "Time from a message's arrival at the broker to the completion of the send carrying it to a subscriber.",
     "relay_latency_seconds"},
};

}  // namespace

class BrokerCollectable final : public prometheus::Collectable {
 public:
  BrokerCollectable(MetricsExporter::Counters counters, MetricsExporter::Histograms histograms)
      : counters_(std::move(counters)), histograms_(std::move(histograms)) {}

  std::vector<MetricFamily> Collect() const override {
    const StatsSnapshot stats = counters_();
    std::vector<MetricFamily> out;
    for (const auto& def : kMetrics) {
      MetricFamily f{def.name, def.help, def.type, {}};
      // Captures the type alone: a lambda holding a reference to the
      // file-local MetricDef would have internal linkage in a unity build.
      auto value_of = [type = def.type](std::int64_t v) {
        ClientMetric m;
        if (type == kCounter)
          m.counter.value = static_cast<double>(v);
        else
          m.gauge.value = static_cast<double>(v);
        return m;
      };
      if (def.label == nullptr) {
        auto it = stats.find(def.key);
        f.metric.push_back(value_of(it != stats.end() ? it->second : 0));
      } else {
        const std::string prefix = def.key;
        for (auto it = stats.lower_bound(prefix); it != stats.end() && it->first.rfind(prefix, 0) == 0;
             ++it) {
          ClientMetric m = value_of(it->second);
          m.label.push_back({def.label, it->first.substr(prefix.size())});
          f.metric.push_back(std::move(m));
        }
      }
      out.push_back(std::move(f));
    }
    const auto hists = histograms_();
    for (const auto& def : kHistograms) {
      MetricFamily f{def.name, def.help, MetricType::Histogram, {}};
      ClientMetric m;
      if (auto it = hists.find(def.key); it != hists.end()) {
        const HistogramSnapshot& h = it->second;
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i < h.bounds.size(); ++i) {
          cumulative += h.counts[i];
          m.histogram.bucket.push_back({cumulative, h.bounds[i]});
        }
        cumulative += h.counts.back();
        m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
        m.histogram.sample_count = cumulative;
        m.histogram.sample_sum = h.sum;
      }
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    }
    MetricFamily build{
        "rdmabroker_build_info", "Always 1; the labels say which build is running.", kGauge, {}};
    ClientMetric info;
    info.gauge.value = 1;
    info.label = {{"version", RDMABROKER_VERSION}};
    build.metric.push_back(std::move(info));
    out.push_back(std::move(build));
    return out;
  }

 private:
  MetricsExporter::Counters counters_;
  MetricsExporter::Histograms histograms_;
};

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const std::string& listen, Counters counters,
                                                                Histograms histograms) {
  auto hp = config::parse_host_port(listen, "metrics.listen");
  if (!hp) return hp.error();
  auto fd = listen_tcp(hp->host, hp->port);
  if (!fd) return Error{ErrorKind::kResource, "metrics.listen " + listen + ": " + fd.error().message};
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collectable_ = std::make_shared<BrokerCollectable>(std::move(counters), std::move(histograms));
  PolledServer::Protocol p;
  p.name = "metrics";
  p.max_request = kMaxRequest;
  p.max_clients = kMaxClients;
  p.deadline = kRequestDeadline;
  p.evict_idle_when_full = true;
  MetricsExporter* self = e.get();
  p.answer = [self](const std::string& in) { return self->answer(in); };
  p.too_long = [] {
    return http_response(431, "Request Header Fields Too Large", "text/plain", "request too large\n");
  };
  p.busy = [] { return http_response(503, "Service Unavailable", "text/plain", "too many connections\n"); };
  e->server_ = std::make_unique<PolledServer>(std::move(fd.value()), std::move(p));
  return e;
}

MetricsExporter::~MetricsExporter() = default;

std::string MetricsExporter::scrape() const {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

std::optional<std::string> MetricsExporter::answer(const std::string& request) const {
  const auto end = request.find("\r\n\r\n");
  if (end == std::string::npos) return std::nullopt;  // the headers are not all here yet
  // "GET /metrics HTTP/1.1": the method and the path, query ignored.
  const auto sp1 = request.find(' ');
  const auto sp2 = sp1 == std::string::npos ? sp1 : request.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || sp2 > end)
    return http_response(400, "Bad Request", "text/plain", "bad request\n");
  const std::string method = request.substr(0, sp1);
  std::string path = request.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (path != "/metrics")
    return http_response(404, "Not Found", "text/plain", "only /metrics is served here\n");
  if (method != "GET") return http_response(405, "Method Not Allowed", "text/plain", "GET /metrics\n");
  return http_response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", scrape());
}

}  // namespace rdmabroker::daemon
