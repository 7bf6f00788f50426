// Where every new connection is let in or refused, whichever transport
// brought it (the RDMA listener's connect requests, a worker's TCP
// handshakes): its connect request checked (SPEC.md §2), a connection slot
// taken (limits.max_connections), and every refusal logged and counted once,
// in one set of counters. Any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "broker/connection_slots.hpp"
#include "broker/stats.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

class Admission {
 public:
  /// The transports, as counted (tcp.rejected is a series of its own).
  enum class Via : std::uint8_t { kRdma, kTcp };

  Admission(ConnectionSlots& slots, std::uint32_t buffer_size) : slots_(slots), buffer_size_(buffer_size) {}

  /// Checks a connect request: nothing, or the reason to refuse it (then
  /// refuse() it). Every frame the broker sends must fit the client's buffers.
  std::optional<proto::RejectReason> check(std::span<const std::byte> request,
                                           proto::ConnectRequest& out) const;
  /// A connection slot, or the reason to refuse: shutting down, or at the
  /// connection limit (counted as limits.refused.connections as well).
  std::optional<std::uint32_t> reserve(bool stopping, proto::RejectReason& why);
  /// Gives back a slot whose connection was never made.
  void release(std::uint32_t slot) { slots_.release(slot); }
  /// Logs and counts a refusal (`reason`: what the peer is told, if anything).
  void refuse(Via via, std::string_view peer, std::string_view why,
              std::optional<proto::RejectReason> reason);

  /// Declares the admission counters (connections.rejected, tcp.rejected,
  /// limits.refused.connections).
  void visit(StatsVisitor& v) const;

 private:
  ConnectionSlots& slots_;
  const std::uint32_t buffer_size_;
  std::atomic<std::uint64_t> rejected_[2] = {0, 0};  // by Via
  std::atomic<std::uint64_t> over_limit_{0};
};

}  // namespace rdmabroker::daemon
