// SPDX-License-Identifier: Apache-2.0
// spdlog set-up from the config's logging section: the console in the
// foreground, journald under systemd (target auto), text or one JSON object
// per line. Level and format change on reload; the target does not.
#pragma once

#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

/// True when systemd started us (it sets INVOCATION_ID for every unit).
bool started_by_systemd();

/// Installs the default logger; returns where it logs, for the first line.
std::string setup_logging(const config::LogSettings& settings);
/// Applies a reloaded level and format to the running logger.
void apply_log_settings(const config::LogSettings& settings);

}  // namespace rdmabroker::daemon
