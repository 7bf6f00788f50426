// SPDX-License-Identifier: Apache-2.0
// Live reload (SIGHUP, `rdmabroker reload`, `systemctl reload`): read and
// validate the file again, diff it against the running config into typed
// changes, and apply them only if every one may change live. A file with
// errors, or a change that needs a restart, leaves the running config exactly
// as it was. Every outcome is logged and counted (reloads.ok / refused /
// failed); connected clients are never dropped.
//
// Command-line flags win over the file on every reload too (command_line.hpp):
// what is compared is the effective configuration before and after, so a
// flagged setting never shows as changed; a file edit that a flag masks is
// named in the outcome as overridden, and neither applied nor refused.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "server.hpp"
#include "broker/stats.hpp"
#include "ops/command_line.hpp"
#include "ops/systemd.hpp"
#include "rdmabroker/config/config.hpp"

namespace rdmabroker::daemon {

class Reloader {
 public:
  /// `file` is what the file said at start, `running` that with the flags applied.
  Reloader(std::string path, CommandLine command_line, config::Config file, config::Config running,
           Server& broker, SystemdNotifier& notifier)
      : path_(std::move(path)),
        command_line_(std::move(command_line)),
        file_(std::move(file)),
        running_(std::move(running)),
        broker_(broker),
        notifier_(notifier) {}

  struct Outcome {
    bool ok = false;
    std::string message;                  // for the log, the admin reply and systemd's STATUS
    std::vector<config::Change> changes;  // applied (ok) or offending (refused)
    /// Edited in the file but masked by a flag: "key (from -> to) overridden by --flag".
    std::vector<std::string> overridden;
  };
  Outcome reload();

  const config::Config& running() const { return running_; }
  /// Declares the reload counters (reloads.ok / refused / failed) to `v`.
  void visit_stats(StatsVisitor& v) const;

 private:
  std::string path_;  // empty: no file, defaults and the command line only
  CommandLine command_line_;
  config::Config file_;     // the file's own settings, as last read
  config::Config running_;  // file_ with the flags applied: what the broker runs
  Server& broker_;
  SystemdNotifier& notifier_;
  std::atomic<std::uint64_t> ok_{0}, refused_{0}, failed_{0};  // read by the metrics thread
};

/// Reads the file's settings: `path`, or the defaults when `path` is empty.
Result<config::Config> read_file_config(const std::string& path);

}  // namespace rdmabroker::daemon
