// Prometheus metrics (prometheus-cpp's pull exposer, GET /metrics). Every
// metric is declared once, in the table in metrics.cpp, with its type and
// help; values are read at scrape time from the broker's counters (which the
// workers keep anyway), so exporting costs the data path nothing. Names use
// the rdmabroker_ prefix and base units; labels are bounded (reason,
// transport, outcome), never a subject or a client.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "broker/stats.hpp"
#include "rdmabroker/result.hpp"

namespace prometheus {
class Exposer;
}

namespace rdmabroker::daemon {

class MetricsExporter {
 public:
  using Counters = std::function<StatsSnapshot()>;
  using Histograms = std::function<std::map<std::string, HistogramSnapshot>()>;

  /// Listens on "host:port"; the error names the address.
  static Result<std::unique_ptr<MetricsExporter>> start(const std::string& listen, Counters counters,
                                                        Histograms histograms);
  ~MetricsExporter();

 private:
  MetricsExporter() = default;
  std::shared_ptr<class BrokerCollectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // after collectable_: stops serving first
};

}  // namespace rdmabroker::daemon
