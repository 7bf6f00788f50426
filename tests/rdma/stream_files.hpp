// SPDX-License-Identifier: Apache-2.0
// What a stream's directory holds, read with the broker's own store
// (daemon/store/FileStore) once the broker has stopped: how the stream
// tests check what was stored, byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/file_store.hpp"

namespace rdmabroker::test {

struct StoredMessage {
  std::string subject;
  std::string headers;  // the header block as stored
  std::string payload;
};

/// Every live message of the store in `directory`, in sequence order.
inline std::vector<StoredMessage> read_stream(const std::string& directory) {
  auto s = daemon::store::FileStore::open({directory, std::uint64_t{64} << 20, {}}, 0);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  std::vector<StoredMessage> out;
  if (!s.ok()) return out;
  std::vector<std::byte> buf(1 << 16);
  for (auto seq = s.value()->next_live(1); seq; seq = s.value()->next_live(*seq + 1)) {
    auto r = s.value()->read(*seq, buf);
    EXPECT_TRUE(r.ok()) << "message " << *seq << ": " << (r.ok() ? "" : r.error().message);
    if (!r.ok()) continue;
    const auto text = [](std::span<const std::byte> b) {
      return std::string(reinterpret_cast<const char*>(b.data()), b.size());
    };
    out.push_back({std::string(r->subject), text(r->headers), text(r->payload)});
  }
  return out;
}

}  // namespace rdmabroker::test
