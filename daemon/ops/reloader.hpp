// Live reload (SIGHUP, `rdmabroker reload`, `systemctl reload`): read and
// validate the file again, diff it against the running config into typed
// changes, and apply them only if every one may change live. A file with
// errors, or a change that needs a restart, leaves the running config exactly
// as it was. Every outcome is logged and counted (reloads.ok / refused /
// failed); connected clients are never dropped.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "broker/broker.hpp"
#include "broker/stats.hpp"
#include "ops/systemd.hpp"
#include "rdmabroker/config/config.hpp"

namespace rdmabroker::daemon {

class Reloader {
 public:
  /// Command-line settings, applied over the file on start and on every reload.
  using Overrides = std::function<void(config::Config&)>;

  Reloader(std::string path, Overrides overrides, config::Config running, Broker& broker, SystemdNotifier& notifier)
      : path_(std::move(path)),
        overrides_(std::move(overrides)),
        running_(std::move(running)),
        broker_(broker),
        notifier_(notifier) {}

  struct Outcome {
    bool ok = false;
    std::string message;                  // for the log, the admin reply and systemd's STATUS
    std::vector<config::Change> changes;  // applied (ok) or offending (refused)
  };
  Outcome reload();

  const config::Config& running() const { return running_; }
  void add_counters(StatsSnapshot& s) const;

 private:
  std::string path_;  // empty: no file, defaults and the command line only
  Overrides overrides_;
  config::Config running_;
  Broker& broker_;
  SystemdNotifier& notifier_;
  std::atomic<std::uint64_t> ok_{0}, refused_{0}, failed_{0};  // read by the metrics thread
};

/// Reads the config as the broker does at start: `path`, or the defaults
/// when `path` is empty, with the command line applied over it.
Result<config::Config> read_config(const std::string& path, const Reloader::Overrides& overrides);

}  // namespace rdmabroker::daemon
