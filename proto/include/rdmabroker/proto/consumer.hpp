// SPDX-License-Identifier: Apache-2.0
// A stream consumer's settings as a CONSUME frame carries them (SPEC.md
// §3.11): 32 bytes, little-endian.
//
//   0  u8  start        kAll .. kTime
//   1  u8  ack          kNone, kExplicit, kCumulative
//   2  u8  flags        bit 0 pull, bit 1 replay at the original pace; others 0
//   3  u8  reserved     0
//   4  u32 max_ack_pending  messages delivered and not acknowledged, at most (1 .. 65,536)
//   8  u64 start_at     kSequence: the first sequence; kTime: CLOCK_REALTIME ns; else 0
//  16  u32 ack_wait_ms  how long a delivery waits for its acknowledgement (1 .. 86,400,000)
//  20  u32 max_deliver  deliveries of one message at most; 0: no limit
//  24  u64 reserved     0
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "rdmabroker/proto/codes.hpp"

namespace rdmabroker::proto {

enum class ConsumerStart : std::uint8_t { kAll, kNew, kLast, kLastPerSubject, kSequence, kTime };
enum class ConsumerAck : std::uint8_t { kNone, kExplicit, kCumulative };

inline constexpr std::uint8_t kConsumerPull = 1;
inline constexpr std::uint8_t kConsumerOriginalPace = 2;
inline constexpr std::uint32_t kMaxAckPendingLimit = 65536;
inline constexpr std::uint32_t kMaxAckWaitMs = 86'400'000;

struct ConsumerConfig {
  ConsumerStart start = ConsumerStart::kAll;
  ConsumerAck ack = ConsumerAck::kExplicit;
  bool pull = false;
  bool original_pace = false;
  std::uint32_t max_ack_pending = 1024;
  std::uint64_t start_at = 0;
  std::uint32_t ack_wait_ms = 30'000;
  std::uint32_t max_deliver = 0;

  bool operator==(const ConsumerConfig&) const = default;
};

inline void encode_consumer_config(const ConsumerConfig& c, std::span<std::byte, kConsumeConfigLen> out) {
  std::memset(out.data(), 0, out.size());
  out[0] = static_cast<std::byte>(c.start);
  out[1] = static_cast<std::byte>(c.ack);
  out[2] =
      static_cast<std::byte>((c.pull ? kConsumerPull : 0) | (c.original_pace ? kConsumerOriginalPace : 0));
  std::memcpy(out.data() + 4, &c.max_ack_pending, 4);
  std::memcpy(out.data() + 8, &c.start_at, 8);
  std::memcpy(out.data() + 16, &c.ack_wait_ms, 4);
  std::memcpy(out.data() + 20, &c.max_deliver, 4);
}

/// The settings in a CONSUME payload, or nullopt when a field is out of
/// range or a reserved byte is not 0 (CONSUMER_INVALID).
inline std::optional<ConsumerConfig> decode_consumer_config(std::span<const std::byte> in) {
  if (in.size() != kConsumeConfigLen) return std::nullopt;
  ConsumerConfig c;
  const auto start = static_cast<std::uint8_t>(in[0]);
  const auto ack = static_cast<std::uint8_t>(in[1]);
  const auto flags = static_cast<std::uint8_t>(in[2]);
  std::uint64_t reserved = 0;
  std::memcpy(&reserved, in.data() + 24, 8);
  if (start > static_cast<std::uint8_t>(ConsumerStart::kTime) ||
      ack > static_cast<std::uint8_t>(ConsumerAck::kCumulative) ||
      (flags & ~(kConsumerPull | kConsumerOriginalPace)) != 0 || in[3] != std::byte{0} || reserved != 0)
    return std::nullopt;
  c.start = static_cast<ConsumerStart>(start);
  c.ack = static_cast<ConsumerAck>(ack);
  c.pull = (flags & kConsumerPull) != 0;
  c.original_pace = (flags & kConsumerOriginalPace) != 0;
  std::memcpy(&c.max_ack_pending, in.data() + 4, 4);
  std::memcpy(&c.start_at, in.data() + 8, 8);
  std::memcpy(&c.ack_wait_ms, in.data() + 16, 4);
  std::memcpy(&c.max_deliver, in.data() + 20, 4);
  if (c.max_ack_pending == 0 || c.max_ack_pending > kMaxAckPendingLimit || c.ack_wait_ms == 0 ||
      c.ack_wait_ms > kMaxAckWaitMs || (c.start == ConsumerStart::kSequence && c.start_at == 0))
    return std::nullopt;
  return c;
}

}  // namespace rdmabroker::proto
