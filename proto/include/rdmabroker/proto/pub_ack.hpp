// SPDX-License-Identifier: Apache-2.0
// A PUB_ACK's answer (SPEC.md §3.10): one acknowledged PUBLISH, or from
// version 12 a RANGE of them, as a client reads it.
#pragma once

#include <cstdint>
#include <string_view>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::proto {

/// What a decoded PUB_ACK answers (SPEC.md §3.10): `count` PUBLISHes, with
/// the ids from `first_id` on, stored from `first_sequence` on (one, and
/// the sequence 0 of a refusal, without RANGE).
struct PubAckAnswer {
  std::uint64_t first_id = 0;
  std::uint64_t first_sequence = 0;
  std::uint32_t count = 1;
  std::string_view stream;
};
inline PubAckAnswer pub_ack_answer(const Frame& f) {
  PubAckAnswer a;
  a.first_id = f.header.sequence;
  a.first_sequence = load<std::uint64_t>(f.payload.data());
  std::size_t name_at = kPubAckMinLen;
  if ((f.header.flags & kFlagRange) != 0) {
    a.count = load<std::uint32_t>(f.payload.data() + 8);
    name_at = kPubAckRangeMinLen;
  }
  a.stream =
      std::string_view(reinterpret_cast<const char*>(f.payload.data()) + name_at, f.payload.size() - name_at);
  return a;
}

}  // namespace rdmabroker::proto
