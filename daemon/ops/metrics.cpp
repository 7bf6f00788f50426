// SPDX-License-Identifier: Apache-2.0
#include "ops/metrics.hpp"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <map>
#include <vector>

#include <spdlog/spdlog.h>

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

/// The exporter's visitor: groups the declared series into families in the
/// order they are first declared, summing series declared more than once (one
/// per worker) and checking that every series of a family agrees on its kind,
/// help and label.
class FamilyCollector final : public StatsVisitor {
 public:
  void counter(const StatInfo& info, std::uint64_t value) override {
    if (auto* m = series(info, MetricType::Counter))
      m->counter.value += static_cast<double>(value) * info.export_scale;
  }
  void gauge(const StatInfo& info, std::int64_t value) override {
    if (auto* m = series(info, MetricType::Gauge))
      m->gauge.value += static_cast<double>(value) * info.export_scale;
  }
  void histogram(const StatInfo& info, const HistogramSnapshot& value) override {
    if (series(info, MetricType::Histogram) == nullptr) return;
    auto [it, fresh] = histograms_.try_emplace(std::string(info.metric), value);
    if (!fresh && !it->second.merge(value)) error(info, "histogram bounds differ");
  }

  MetricFamilies take() {
    MetricFamilies out;
    for (auto& f : families_) {
      if (f.type == MetricType::Histogram) f.metric.assign(1, histogram_metric(histograms_[f.name]));
      out.families.push_back(std::move(f));
    }
    out.errors = std::move(errors_);
    return out;
  }

 private:
  static ClientMetric histogram_metric(const HistogramSnapshot& h) {
    ClientMetric m;
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      m.histogram.bucket.push_back({cumulative, h.bounds[i]});
    }
    if (!h.counts.empty()) cumulative += h.counts.back();
    m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = h.sum;
    return m;
  }

  void error(const StatInfo& info, const std::string& what) {
    errors_.push_back(std::string(info.metric) + " (" + info.key + "): " + what);
  }

  /// The series `info` names in its family (made on first sight), or null
  /// when it is not exported or contradicts its family's declaration.
  ClientMetric* series(const StatInfo& info, MetricType type) {
    if (info.metric.empty()) return nullptr;
    const std::string name(info.metric);
    auto [it, fresh] = index_.try_emplace(name, families_.size());
    if (fresh) {
      families_.push_back(MetricFamily{name, std::string(info.help), type, {}});
      labels_.emplace_back(info.label);
    }
    MetricFamily& f = families_[it->second];
    const char* contradiction = f.type != type                      ? "declared as another kind"
                                : f.help != info.help               ? "declared with another help text"
                                : labels_[it->second] != info.label ? "declared with another label"
                                                                    : nullptr;
    if (contradiction != nullptr) {
      error(info, contradiction);
      return nullptr;
    }
    if (type == MetricType::Histogram) return &dummy_;
    for (auto& m : f.metric) {
      if (info.label.empty() || m.label.at(0).value == info.label_value) return &m;
    }
    ClientMetric& m = f.metric.emplace_back();
    if (!info.label.empty()) m.label.push_back({std::string(info.label), info.label_value});
    return &m;
  }

  std::vector<MetricFamily> families_;
  std::vector<std::string_view> labels_;  // per family
  std::map<std::string, std::size_t> index_;
  std::map<std::string, HistogramSnapshot> histograms_;
  std::vector<std::string> errors_;
  ClientMetric dummy_;
};

}  // namespace

MetricFamilies collect_metric_families(const MetricsExporter::Visit& visit) {
  FamilyCollector c;
  visit(c);
  MetricFamilies out = c.take();
  MetricFamily build{
      "rdmabroker_build_info", "Always 1; the labels say which build is running.", MetricType::Gauge, {}};
  ClientMetric info;
  info.gauge.value = 1;
  info.label = {{"version", RDMABROKER_VERSION}};
  build.metric.push_back(std::move(info));
  out.families.push_back(std::move(build));
  return out;
}

class BrokerCollectable final : public prometheus::Collectable {
 public:
  explicit BrokerCollectable(MetricsExporter::Visit visit) : visit_(std::move(visit)) {}

  std::vector<MetricFamily> Collect() const override {
    MetricFamilies out = collect_metric_families(visit_);
    // A contradiction is a programming error that the unit tests catch; a
    // running broker still serves every family it could build.
    for (const auto& e : out.errors) spdlog::error("metrics: {}", e);
    return std::move(out.families);
  }

 private:
  MetricsExporter::Visit visit_;
};

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const std::string& listen, Visit visit,
                                                                Probes probes) {
  auto hp = config::parse_host_port(listen, "metrics.listen");
  if (!hp) return hp.error();
  auto fd = listen_tcp(hp->host, hp->port);
  if (!fd) return Error{ErrorKind::kResource, "metrics.listen " + listen + ": " + fd.error().message};
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collectable_ = std::make_shared<BrokerCollectable>(std::move(visit));
  e->probes_ = std::move(probes);
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
  const bool live = path == "/healthz", ready = path == "/readyz";
  if (path != "/metrics" && !live && !ready) {
    return http_response(404, "Not Found", "text/plain",
                         "only /metrics, /healthz and /readyz are served here\n");
  }
  if (method != "GET" && method != "HEAD")
    return http_response(405, "Method Not Allowed", "text/plain", "GET or HEAD " + path + "\n");
  std::string response;
  if (live || ready) {
    // 200 or 503, the status an orchestrator acts on; the body says why.
    const HealthReport report = live ? probes_.live() : probes_.ready();
    const bool ok = report.ok();
    response = http_response(ok ? 200 : 503, ok ? "OK" : "Service Unavailable", "text/plain; charset=utf-8",
                             render(report, path.substr(1)));
  } else {
    response = http_response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", scrape());
  }
  // HEAD (RFC 9110 §9.3.2): GET's status and headers, Content-Length included, without the body.
  if (method == "HEAD") response.resize(response.find("\r\n\r\n") + 4);
  return response;
}

}  // namespace rdmabroker::daemon
