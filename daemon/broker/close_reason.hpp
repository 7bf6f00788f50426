// SPDX-License-Identifier: Apache-2.0
// Why a connection ended. Every close carries exactly one; it is logged once and
// counted (stats key "closed.<name>").
#pragma once

#include <cstddef>
#include <string_view>

namespace rdmabroker::daemon {

enum class CloseReason : unsigned char {
  kClientClose,          // the client sent CLOSE (orderly)
  kPeerDisconnected,     // the transport ended without CLOSE: crash, kill, network loss
  kProtocolError,        // malformed or illegal frame; the client got an ERROR first
  kSlowConsumer,         // outbound queue bound exceeded
  kWorkCompletionError,  // a send or receive completed in error
  kQpFatal,              // asynchronous QP error event
  kBrokerShutdown,
  kDeviceRemoved,
  kConnectFailed,           // the handshake never completed (REJECTED/UNREACHABLE/timeout)
  kAuthFailed,              // credentials refused, missing, or not presented in time
  kAuthRevoked,             // a reload removed the user or changed its credential
  kAuthTimeout,             // no accepted CONNECT within auth.timeout_ms of connecting
  kUnauthenticatedEvicted,  // closed, not authenticated yet, to admit a newer connection
  kFrameTimeout,            // a TCP frame begun and not finished within limits.frame_timeout_ms
  kFragmentTimeout,  // a message in fragments left open past limits.fragment_timeout_ms (SPEC.md §3.7)
  kCount,
};

constexpr std::string_view to_string(CloseReason r) {
  switch (r) {
    case CloseReason::kClientClose:
      return "client_close";
    case CloseReason::kPeerDisconnected:
      return "peer_disconnected";
    case CloseReason::kProtocolError:
      return "protocol_error";
    case CloseReason::kSlowConsumer:
      return "slow_consumer";
    case CloseReason::kWorkCompletionError:
      return "wc_error";
    case CloseReason::kQpFatal:
      return "qp_fatal";
    case CloseReason::kBrokerShutdown:
      return "shutdown";
    case CloseReason::kDeviceRemoved:
      return "device_removed";
    case CloseReason::kConnectFailed:
      return "connect_failed";
    case CloseReason::kAuthFailed:
      return "auth_failed";
    case CloseReason::kAuthRevoked:
      return "auth_revoked";
    case CloseReason::kAuthTimeout:
      return "auth_timeout";
    case CloseReason::kUnauthenticatedEvicted:
      return "unauthenticated_evicted";
    case CloseReason::kFrameTimeout:
      return "frame_timeout";
    case CloseReason::kFragmentTimeout:
      return "fragment_timeout";
    case CloseReason::kCount:
      break;
  }
  return "unknown";
}

inline constexpr std::size_t kCloseReasonCount = static_cast<std::size_t>(CloseReason::kCount);

/// Why a message that the broker accepted did not reach a subscriber. Each is
/// a stated policy, counted (stats key "dropped.<name>").
enum class DropReason : unsigned char {
  kSlowConsumer,      // the subscriber's queue bound was exceeded; it is disconnected
  kSubscriberClosed,  // queued for a subscriber whose connection then ended
  kIncomplete,        // a fragmented message whose publisher left or abandoned it (SPEC.md §3.7)
  kNeedsFragments,    // larger than a frame, for a client of version < 4 or a multicast channel
  kBufferTooSmall,    // subject, reply and header block fill a smaller client receive buffer (SPEC.md §3.7)
  kCount,
};

constexpr std::string_view to_string(DropReason r) {
  switch (r) {
    case DropReason::kSlowConsumer:
      return "slow_consumer";
    case DropReason::kSubscriberClosed:
      return "subscriber_closed";
    case DropReason::kIncomplete:
      return "incomplete";
    case DropReason::kNeedsFragments:
      return "needs_fragments";
    case DropReason::kBufferTooSmall:
      return "buffer_too_small";
    case DropReason::kCount:
      break;
  }
  return "unknown";
}

inline constexpr std::size_t kDropReasonCount = static_cast<std::size_t>(DropReason::kCount);

/// What the messages still queued for a connection count as when it closes.
constexpr DropReason drop_reason_for(CloseReason r) {
  return r == CloseReason::kSlowConsumer ? DropReason::kSlowConsumer : DropReason::kSubscriberClosed;
}

}  // namespace rdmabroker::daemon
