// SPDX-License-Identifier: Apache-2.0
// The broker's settings are the config library's (config/): one definition
// for the YAML loader, the command line and the broker.
#pragma once

#include "rdmabroker/config/settings.hpp"

namespace rdmabroker::daemon {
using config::BrokerOptions;
using config::RdmaMode;
}  // namespace rdmabroker::daemon
