// SPDX-License-Identifier: Apache-2.0
// Prometheus metrics: GET /metrics on metrics.listen (with GET /healthz and
// GET /readyz, ops/health.hpp). Every metric is
// declared once, where its counter is kept (broker/stats.hpp says how), with
// its type and help; values are read at scrape time from the counters the
// workers keep anyway, so exporting costs the data path nothing. Names use the
// rdmabroker_ prefix and base units; labels are bounded (reason, transport,
// outcome), never a subject or a client.
//
// The endpoint is an event-driven HTTP/1.x server on the main thread's poll
// loop (PolledServer), not a thread per connection: a thread-per-connection
// server (civetweb, behind prometheus-cpp's Exposer) is blinded by as many
// idle sockets as it has threads, each held until its request timeout. Here
// an idle socket costs a descriptor: it is dropped at the request deadline,
// or earlier when the connection limit is reached and a newcomer needs its
// place, so a scraper is answered as soon as its request is read.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <optional>
#include <vector>
#include <map>
#include <memory>
#include <string>

#include <prometheus/metric_family.h>

#include "broker/stats.hpp"
#include "ops/health.hpp"
#include "ops/polled_server.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class MetricsExporter {
 public:
  /// Declares every statistic to the visitor it is given (at each scrape).
  using Visit = std::function<void(StatsVisitor&)>;

  /// Connections served at once (an idle one makes room for a newcomer).
  static constexpr std::size_t kMaxClients = 64;
  /// From accept to the response written: a request must arrive well within it.
  static constexpr std::chrono::seconds kRequestDeadline{5};
  /// Request line and headers; a scraper sends a few hundred bytes.
  static constexpr std::size_t kMaxRequest = 8192;

  /// The health reports GET /healthz and GET /readyz answer (ops/health.hpp).
  struct Probes {
    std::function<HealthReport()> live;
    std::function<HealthReport()> ready;
  };

  /// Listens on "host:port"; the error names the address.
  static Result<std::unique_ptr<MetricsExporter>> start(const std::string& listen, Visit visit,
                                                        Probes probes);
  ~MetricsExporter();

  void add_poll_fds(std::vector<pollfd>& fds) const { server_->add_poll_fds(fds); }
  void on_poll(const pollfd* ready, std::size_t count) { server_->on_poll(ready, count); }
  int timeout_ms(int idle) const { return server_->timeout_ms(idle); }

  /// The exposition text of every metric (what GET /metrics returns).
  std::string scrape() const;

 private:
  MetricsExporter() = default;
  std::optional<std::string> answer(const std::string& request) const;

  std::shared_ptr<class BrokerCollectable> collectable_;
  Probes probes_;
  std::unique_ptr<PolledServer> server_;
};

/// The families a scrape exports, and every contradiction between the
/// declarations of one family (kind, help, label): none in a correct build.
struct MetricFamilies {
  std::vector<prometheus::MetricFamily> families;
  std::vector<std::string> errors;
};
MetricFamilies collect_metric_families(const MetricsExporter::Visit& visit);

}  // namespace rdmabroker::daemon
