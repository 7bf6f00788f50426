// The broker's one decision on a connect request, whatever carried it (rdma_cm
// private data or the first 16 bytes of a TCP stream): accept, or the reason
// to refuse (SPEC.md §2).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <spdlog/spdlog.h>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

inline std::optional<proto::RejectReason> check_connect_request(std::span<const std::byte> data,
                                                                std::uint32_t buffer_size,
                                                                proto::ConnectRequest& out) {
  switch (proto::decode(data, out)) {
    case proto::HandshakeStatus::kOk:
      break;
    case proto::HandshakeStatus::kBadVersion:
      return proto::RejectReason::kUnsupportedVersion;
    case proto::HandshakeStatus::kBadValue:
      return proto::RejectReason::kBufferTooSmall;
    default:
      return proto::RejectReason::kBadMagic;
  }
  // Every frame the broker sends must fit one of the client's buffers.
  if (out.recv_buffer_size < buffer_size) return proto::RejectReason::kBufferTooSmall;
  return std::nullopt;
}

/// How loudly to log a refusal: BUFFER_TOO_SMALL is a step of the handshake
/// (the reject names the size, librdmabroker reconnects with it at once), not
/// an event an operator must look at; every other refusal is.
inline spdlog::level::level_enum refusal_log_level(std::optional<proto::RejectReason> reason) {
  return reason == proto::RejectReason::kBufferTooSmall ? spdlog::level::info : spdlog::level::warn;
}

}  // namespace rdmabroker::daemon
