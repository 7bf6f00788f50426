// SPDX-License-Identifier: Apache-2.0
// The rules between settings that no single key's range can say (a buffer
// size and the queue bounds, TLS and its files, a cluster and its routes):
// checked after parsing and after flags are applied (config::validate).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "rdmabroker/config/config.hpp"

namespace rdmabroker::config {

/// How a broken rule is reported: the key at fault and what is wrong.
using RuleReport = std::function<void(std::string_view key, const std::string& message)>;

/// Reports every rule `c` breaks.
void check_rules(const Config& c, const RuleReport& report);

}  // namespace rdmabroker::config
