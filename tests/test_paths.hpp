// SPDX-License-Identifier: Apache-2.0
// Where the files and programs a test uses are, found at run time from the
// test program's own path. The build passes paths relative to the test
// executable's directory (RDMABROKER_SOURCE_REL and, for the integration
// tests, RDMABROKERD_REL, ...) rather than absolute ones: compile definitions
// are part of what ccache hashes, and absolute paths made every test unit miss
// the cache in a new checkout (CI's clone), the heaviest units of the build.
#pragma once

#include <filesystem>
#include <string>

namespace rdmabroker::test {

/// `relative`, resolved against the directory of the running test program.
inline std::string beside_this_program(const char* relative) {
  static const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  return (dir / relative).lexically_normal().string();
}

/// The source tree this test was built from (config/broker.yaml, deploy/, ...).
inline const std::string& source_dir() {
  static const std::string path = beside_this_program(RDMABROKER_SOURCE_REL);
  return path;
}

}  // namespace rdmabroker::test
