// SPDX-License-Identifier: Apache-2.0
// Where every new connection is let in or refused, whichever transport
// brought it (the RDMA listener's connect requests, a worker's TCP
// accepts): its connect request checked (SPEC.md §2), a connection slot
// taken (limits.max_connections), and every refusal logged (rate-limited)
// and counted once, in one set of counters. Any thread.
//
// It also bounds the connections that have not authenticated yet
// (docs/security.md, "Password guessing and connection floods"): at most
// limits.max_unauthenticated_per_address from one address (more are
// refused), and at most limits.max_unauthenticated in all; a new connection
// beyond that bound evicts an unauthenticated one (the caller posts the
// eviction to its worker), never an authenticated one: the oldest of those
// that have sent no CONNECT yet, and only when there are none, the oldest of
// those whose credentials wait for their check. A flood of connections that
// never log in (cheap for an attacker: no password to guess) thus cannot push
// out a login that is waiting its turn.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "broker/connection_slots.hpp"
#include "broker/stats.hpp"
#include "broker/log_throttle.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

/// "10.0.0.7" of "10.0.0.7:41234" (and "fe80::1" of "fe80::1:41234"): limits
/// and login pacing are per address, whatever the client's port.
std::string_view host_of(std::string_view peer);

class Admission {
 public:
  /// The transports, as counted (tcp.rejected is a series of its own).
  enum class Via : std::uint8_t { kRdma, kTcp };

  /// Who asks for a slot: the connection it will be and the worker that will own it.
  struct Claim {
    std::uint64_t connection = 0;
    std::uint32_t worker = 0;
    std::string_view peer;  // "host:port"
  };
  /// An unauthenticated connection to close to make room for a new one.
  struct Eviction {
    std::uint64_t connection = 0;
    std::uint32_t worker = 0;
  };

  Admission(ConnectionSlots& slots, std::uint32_t max_connections, std::uint32_t buffer_size)
      : slots_(slots), buffer_size_(buffer_size), holders_(max_connections) {}

  /// Checks a connect request: nothing, or the reason to refuse it (then
  /// refuse() it). Every frame the broker sends must fit the client's
  /// buffers: a client of version 4 may have smaller ones than the broker
  /// (it is sent fragments, SPEC.md §3.7), an older one may not.
  std::optional<proto::RejectReason> check(Via via, std::span<const std::byte> request,
                                           proto::ConnectRequest& out) const;
  /// The protocol version a connection made by `request` over `via` gets
  /// (SPEC.md §2.1): over RDMA, §5.1's credits rule applies; over TCP there
  /// are no credits (§1.2), so it is the version asked for.
  static std::uint8_t version_for(Via via, const proto::ConnectRequest& request) {
    return via == Via::kRdma ? proto::connection_version(request)
                             : proto::negotiate_version(request.max_version);
  }
  /// A connection slot for a new, unauthenticated connection, or the reason
  /// to refuse: shutting down, at the connection limit, or its address at
  /// its unauthenticated limit (the last two counted as limit refusals).
  /// `evict` is set when the unauthenticated bound was full: the caller
  /// posts that connection's closing to its worker.
  std::optional<std::uint32_t> reserve(bool stopping, const Claim& who, proto::RejectReason& why,
                                       std::optional<Eviction>& evict);
  /// The connection in `slot` sent its CONNECT and waits for the verdict:
  /// evicted only after every connection that has sent nothing.
  void awaiting_verdict(std::uint32_t slot);
  /// The connection in `slot` authenticated: it no longer counts against the
  /// unauthenticated bounds.
  void authenticated(std::uint32_t slot);
  /// Gives back a slot (the connection ended, or was never made).
  void release(std::uint32_t slot);
  /// Logs (rate-limited per reason) and counts a refusal (`reason`: what the peer is told, if anything).
  void refuse(Via via, std::string_view peer, std::string_view why,
              std::optional<proto::RejectReason> reason);
  /// limits.max_unauthenticated and ..._per_address as they take effect (start and reload).
  void set_unauthenticated_limits(std::uint32_t total, std::uint32_t per_address) {
    max_unauthenticated_.store(total, std::memory_order_relaxed);
    max_unauthenticated_per_address_.store(per_address, std::memory_order_relaxed);
  }

  /// Declares the admission counters (connections.rejected, tcp.rejected,
  /// limits.refused.*, connections.unauthenticated, ...).
  void visit(StatsVisitor& v) const;

 private:
  /// Who holds a slot while it is unauthenticated.
  struct Holder {
    bool unauthenticated = false;
    bool awaiting_verdict = false;  // its CONNECT came: in awaiting_ instead of silent_
    std::uint64_t since = 0;        // admission order: the oldest is evicted first
    std::uint64_t connection = 0;
    std::uint32_t worker = 0;
    std::string address;
  };
  /// Takes `slot` out of the unauthenticated set (under mu_).
  void leave(std::uint32_t slot);

  ConnectionSlots& slots_;
  const std::uint32_t buffer_size_;
  std::atomic<std::uint32_t> max_unauthenticated_{256};
  std::atomic<std::uint32_t> max_unauthenticated_per_address_{32};

  mutable std::mutex mu_;
  std::vector<Holder> holders_;  // by slot (mu_)
  // Unauthenticated connections, since -> slot, oldest first (mu_): those
  // that have sent nothing, and those whose CONNECT waits for its verdict.
  std::map<std::uint64_t, std::uint32_t> silent_;
  std::map<std::uint64_t, std::uint32_t> awaiting_;
  std::unordered_map<std::string, std::uint32_t> per_address_;  // unauthenticated by address (mu_)
  std::uint64_t next_since_ = 0;                                // (mu_)

  std::atomic<std::uint64_t> rejected_[2] = {0, 0};  // by Via
  std::atomic<std::uint64_t> over_limit_{0};
  std::atomic<std::uint64_t> over_address_limit_{0};
  std::atomic<std::uint64_t> evicted_{0};
  /// One per reject reason, and one for refusals the peer is not told (closed or timed out in the handshake).
  std::array<LogThrottle, 16> log_throttles_;
};

}  // namespace rdmabroker::daemon
