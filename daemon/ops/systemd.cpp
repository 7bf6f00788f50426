// SPDX-License-Identifier: Apache-2.0
#include "ops/systemd.hpp"

#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <ctime>

namespace rdmabroker::daemon {

SystemdNotifier::SystemdNotifier() {
  active_ = std::getenv("NOTIFY_SOCKET") != nullptr;
  std::uint64_t usec = 0;
  if (active_ && sd_watchdog_enabled(0, &usec) > 0) watchdog_period_ = std::chrono::milliseconds(usec / 2000);
}

void SystemdNotifier::notify(const std::string& state) {
  if (active_) sd_notify(0, state.c_str());
}

void SystemdNotifier::ready(const std::string& status) { notify("READY=1\nSTATUS=" + status); }
void SystemdNotifier::status(const std::string& status) { notify("STATUS=" + status); }

void SystemdNotifier::reloading() {
  // systemd matches RELOADING=1 to the reload it started by this timestamp.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const auto usec = static_cast<unsigned long long>(ts.tv_sec) * 1000000ull +
                    static_cast<unsigned long long>(ts.tv_nsec) / 1000;
  notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec));
}

void SystemdNotifier::reloaded(const std::string& status) { notify("READY=1\nSTATUS=" + status); }
void SystemdNotifier::stopping() { notify("STOPPING=1\nSTATUS=stopping"); }
void SystemdNotifier::watchdog() { notify("WATCHDOG=1"); }

}  // namespace rdmabroker::daemon
