// SPDX-License-Identifier: Apache-2.0
// Talks to rdmabrokerd's admin socket: one command line out, one JSON line back.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "rdmabroker/result.hpp"

namespace rdmabroker::cli {

inline constexpr const char* kDefaultAdminSocket = "/run/rdmabroker/admin.sock";

Result<std::string> admin_request(const std::string& socket_path, const std::string& command);

/// One admin command; its JSON reply (an object), or why there is none.
Result<nlohmann::json> admin_command(const std::string& socket_path, const std::string& command);

/// Asks the broker to reload its configuration file: the broker's message
/// when it did, or why not (kBrokerError: the broker refused, its reason).
Result<std::string> request_reload(const std::string& socket_path);

}  // namespace rdmabroker::cli
