// SPDX-License-Identifier: Apache-2.0
// Talks to rdmabrokerd's admin socket: one command line out, one JSON line back.
#pragma once

#include <string>

#include "rdmabroker/result.hpp"

namespace rdmabroker::cli {

inline constexpr const char* kDefaultAdminSocket = "/run/rdmabroker/admin.sock";

Result<std::string> admin_request(const std::string& socket_path, const std::string& command);

}  // namespace rdmabroker::cli
