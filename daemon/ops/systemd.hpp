// SPDX-License-Identifier: Apache-2.0
// The systemd service protocol (sd_notify): READY=1 once listening, STATUS=
// lines, RELOADING=1 with MONOTONIC_USEC around a reload (systemd 252 has no
// Type=notify-reload, but honours these), STOPPING=1, and WATCHDOG=1 sent
// only while every worker's loop is going round. Outside systemd every call
// is a no-op.
#pragma once

#include <chrono>
#include <string>

namespace rdmabroker::daemon {

class SystemdNotifier {
 public:
  SystemdNotifier();
  bool active() const { return active_; }
  void ready(const std::string& status);
  void status(const std::string& status);
  void reloading();
  void reloaded(const std::string& status);
  void stopping();
  void watchdog();
  /// Half of WatchdogSec (how often to ping), or zero when no watchdog is set.
  std::chrono::milliseconds watchdog_period() const { return watchdog_period_; }

 private:
  void notify(const std::string& state);
  bool active_ = false;
  std::chrono::milliseconds watchdog_period_{0};
};

}  // namespace rdmabroker::daemon
