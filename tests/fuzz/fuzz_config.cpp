// SPDX-License-Identifier: Apache-2.0
// The config loader on arbitrary text, as an operator's file or a reload
// reads it: it yields a Config or errors naming where, never a crash; a
// Config it yields differs from itself in nothing, and can be diffed against
// the defaults (what a reload does).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "rdmabroker/config/config.hpp"

namespace config = rdmabroker::config;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = config::parse(text, "fuzz.yaml");
  if (!parsed.ok()) {
    FUZZ_CHECK(!parsed.error().message.empty());
    return 0;
  }
  FUZZ_CHECK(config::diff(parsed.value(), parsed.value()).empty());
  for (const auto& change : config::diff(config::Config{}, parsed.value())) FUZZ_CHECK(!change.key.empty());
  return 0;
}
