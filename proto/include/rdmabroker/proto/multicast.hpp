// SPDX-License-Identifier: Apache-2.0
// Multicast parts of the wire protocol (SPEC.md §7): the MCAST_JOIN payload
// and the header of every UD datagram the broker sends to a group. Pure
// computation on byte spans, like wire.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::proto {

/// MCAST_JOIN payload (24 bytes): which channel serves the subscription and
/// the group to join for it.
struct McastJoin {
  std::uint32_t channel = 0;             // broker-wide id of the subject's multicast channel
  std::uint32_t qkey = 0;                // the group's Q_Key (rdma_cm's for the UDP port space)
  std::array<std::uint8_t, 16> group{};  // group address, IPv6 form (IPv4 groups as ::ffff:a.b.c.d)
};

inline std::array<std::byte, kMcastJoinLen> encode(const McastJoin& j) {
  std::array<std::byte, kMcastJoinLen> b{};
  store<std::uint32_t>(b.data(), j.channel);
  store<std::uint32_t>(b.data() + 4, j.qkey);
  std::memcpy(b.data() + 8, j.group.data(), j.group.size());
  return b;
}

inline std::optional<McastJoin> decode_mcast_join(std::span<const std::byte> b) {
  if (b.size() != kMcastJoinLen) return std::nullopt;
  McastJoin j;
  j.channel = load<std::uint32_t>(b.data());
  j.qkey = load<std::uint32_t>(b.data() + 4);
  std::memcpy(j.group.data(), b.data() + 8, j.group.size());
  return j;
}

/// The u64 count that MCAST_REPAIR and MCAST_LOSS carry.
inline std::array<std::byte, kMcastCountLen> encode_count(std::uint64_t n) {
  std::array<std::byte, kMcastCountLen> b{};
  store<std::uint64_t>(b.data(), n);
  return b;
}
inline std::uint64_t decode_count(std::span<const std::byte> b) {
  return b.size() == kMcastCountLen ? load<std::uint64_t>(b.data()) : 0;
}

// ---------------------------------------------------------------- datagrams

inline constexpr std::uint32_t kDatagramMagic = 0x314d4252;  // bytes "RBM1"
inline constexpr std::size_t kDatagramHeaderSize = 32;
/// What precedes a UD receive's data: the Global Routing Header verbs writes
/// into the first 40 bytes of every UD receive buffer.
inline constexpr std::size_t kGrhSize = 40;
/// Most messages the client asks to be repaired in one MCAST_REPAIR.
inline constexpr std::uint64_t kMaxRepairCount = 1024;

/// One datagram: `count` whole consecutive channel messages (PUBLISH frames
/// exactly as the broker received them, back to back), or a fragment of one
/// message too long for a datagram (count 1), or with total_len 0 a heartbeat
/// (count 0) whose sequence is the last the channel sent.
struct DatagramHeader {
  std::uint32_t channel = 0;
  std::uint64_t sequence = 0;   // of the first message
  std::uint32_t total_len = 0;  // bytes of the message(s); 0: heartbeat
  std::uint32_t offset = 0;     // a fragment: where its bytes go in the message; else 0
  std::uint32_t count = 0;      // messages: 1 for a fragment, 0 for a heartbeat
};

inline void encode(std::byte* out, const DatagramHeader& h) {
  store<std::uint32_t>(out, kDatagramMagic);
  store<std::uint32_t>(out + 4, h.channel);
  store<std::uint64_t>(out + 8, h.sequence);
  store<std::uint32_t>(out + 16, h.total_len);
  store<std::uint32_t>(out + 20, h.offset);
  store<std::uint32_t>(out + 24, h.count);
  store<std::uint32_t>(out + 28, 0);
}

/// Decodes a datagram (without the GRH); nullopt when it is not one of ours
/// or its fields do not fit together (a fragment past the message's end, a
/// message longer than `max_message`, a heartbeat with data, ...).
inline std::optional<DatagramHeader> decode_datagram(std::span<const std::byte> b, std::size_t max_message) {
  if (b.size() < kDatagramHeaderSize || load<std::uint32_t>(b.data()) != kDatagramMagic ||
      load<std::uint32_t>(b.data() + 28) != 0) {
    return std::nullopt;
  }
  DatagramHeader h;
  h.channel = load<std::uint32_t>(b.data() + 4);
  h.sequence = load<std::uint64_t>(b.data() + 8);
  h.total_len = load<std::uint32_t>(b.data() + 16);
  h.offset = load<std::uint32_t>(b.data() + 20);
  h.count = load<std::uint32_t>(b.data() + 24);
  const std::uint64_t chunk = b.size() - kDatagramHeaderSize;
  if (h.sequence == 0) return std::nullopt;
  if (h.total_len == 0) return chunk == 0 && h.offset == 0 && h.count == 0 ? std::optional(h) : std::nullopt;
  if (h.total_len > max_message || chunk == 0 || h.count == 0 ||
      std::uint64_t{h.offset} + chunk > h.total_len) {
    return std::nullopt;
  }
  // Several messages only whole, in one datagram.
  if (h.count > 1 && (h.offset != 0 || chunk != h.total_len)) return std::nullopt;
  return h;
}

/// Bytes of message a datagram of an `mtu`-byte path carries.
constexpr std::size_t datagram_chunk(std::size_t mtu) { return mtu - kDatagramHeaderSize; }

}  // namespace rdmabroker::proto
