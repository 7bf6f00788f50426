// SPDX-License-Identifier: Apache-2.0
// What the configuration tests share: the error a configuration is refused with.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "rdmabroker/config/config.hpp"

namespace rdmabroker::config {

/// The message parse() refuses `yaml` with (a test failure if it accepts it).
inline std::string errors_of(std::string_view yaml) {
  auto r = parse(yaml, "broker.yaml");
  EXPECT_FALSE(r.ok()) << yaml;
  return r.ok() ? "" : r.error().message;
}

}  // namespace rdmabroker::config
