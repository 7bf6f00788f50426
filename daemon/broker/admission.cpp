// SPDX-License-Identifier: Apache-2.0
#include "broker/admission.hpp"

#include <spdlog/spdlog.h>

#include <string>

namespace rdmabroker::daemon {

std::string_view host_of(std::string_view peer) {
  const auto colon = peer.rfind(':');
  return colon == std::string_view::npos ? peer : peer.substr(0, colon);
}

std::optional<proto::RejectReason> Admission::check(Via via, std::span<const std::byte> request,
                                                    proto::ConnectRequest& out) const {
  switch (proto::decode(request, out)) {
    case proto::HandshakeStatus::kOk:
      break;
    case proto::HandshakeStatus::kBadVersion:
      return proto::RejectReason::kUnsupportedVersion;
    case proto::HandshakeStatus::kBufferTooSmall:
      return proto::RejectReason::kBufferTooSmall;  // answered with the size to retry with
    case proto::HandshakeStatus::kBadValue:
      // No retry fixes it: BUFFER_TOO_SMALL here would send a client that
      // follows SPEC.md §2.3 round in circles.
      return proto::RejectReason::kInvalidRequest;
    default:
      return proto::RejectReason::kBadMagic;
  }
  if (out.recv_buffer_size < buffer_size_ && version_for(via, out) < proto::kFragmentsVersion)
    return proto::RejectReason::kBufferTooSmall;
  return std::nullopt;
}

std::optional<std::uint32_t> Admission::reserve(bool stopping, const Claim& who, proto::RejectReason& why,
                                                std::optional<Eviction>& evict) {
  evict.reset();
  if (stopping) {
    why = proto::RejectReason::kShuttingDown;
    return std::nullopt;
  }
  const std::string address(host_of(who.peer));
  std::lock_guard lock(mu_);
  if (auto it = per_address_.find(address);
      it != per_address_.end() &&
      it->second >= max_unauthenticated_per_address_.load(std::memory_order_relaxed)) {
    // Refused, not evicting: one address cannot push out the logins of others.
    why = proto::RejectReason::kTooManyConnections;
    over_address_limit_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  auto slot = slots_.acquire();
  if (!slot) {
    why = proto::RejectReason::kTooManyConnections;
    over_limit_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  if (silent_.size() + awaiting_.size() >= max_unauthenticated_.load(std::memory_order_relaxed)) {
    const std::uint32_t oldest = (silent_.empty() ? awaiting_ : silent_).begin()->second;
    evict = Eviction{holders_[oldest].connection, holders_[oldest].worker};
    leave(oldest);
    evicted_.fetch_add(1, std::memory_order_relaxed);
  }
  Holder& h = holders_[*slot];
  h = Holder{true, false, next_since_++, who.connection, who.worker, address};
  silent_.emplace(h.since, *slot);
  ++per_address_[address];
  return slot;
}

void Admission::leave(std::uint32_t slot) {
  Holder& h = holders_[slot];
  if (!h.unauthenticated) return;
  h.unauthenticated = false;
  (h.awaiting_verdict ? awaiting_ : silent_).erase(h.since);
  h.awaiting_verdict = false;
  if (auto it = per_address_.find(h.address); it != per_address_.end() && --it->second == 0)
    per_address_.erase(it);
}

void Admission::awaiting_verdict(std::uint32_t slot) {
  std::lock_guard lock(mu_);
  Holder& h = holders_[slot];
  if (!h.unauthenticated || h.awaiting_verdict) return;
  h.awaiting_verdict = true;
  silent_.erase(h.since);
  awaiting_.emplace(h.since, slot);
}

void Admission::authenticated(std::uint32_t slot) {
  std::lock_guard lock(mu_);
  leave(slot);
}

void Admission::release(std::uint32_t slot) {
  {
    std::lock_guard lock(mu_);
    leave(slot);
  }
  slots_.release(slot);
}

void Admission::refuse(Via via, std::string_view peer, std::string_view why,
                       std::optional<proto::RejectReason> reason) {
  // Counted before the peer can see the refusal: whoever reads the counter
  // after being refused must find its refusal in it.
  rejected_[static_cast<std::size_t>(via)].fetch_add(1, std::memory_order_relaxed);
  // BUFFER_TOO_SMALL is a step of the handshake (the reject names the size,
  // librdmabroker reconnects with it at once), not an event an operator
  // must look at; every other refusal is, within the throttle.
  const auto level =
      reason == proto::RejectReason::kBufferTooSmall ? spdlog::level::info : spdlog::level::warn;
  const std::size_t kind = reason ? static_cast<std::size_t>(*reason) % log_throttles_.size() : 0;
  log_throttled(log_throttles_[kind], level, "{} connection from {} refused: {}",
                via == Via::kRdma ? "rdma" : "tcp", peer, why);
}

void Admission::visit(StatsVisitor& v) const {
  const std::uint64_t rdma = rejected_[0].load(std::memory_order_relaxed);
  const std::uint64_t tcp = rejected_[1].load(std::memory_order_relaxed);
  v.counter({"connections.rejected", "rdmabroker_connections_rejected_total",
             "Connection attempts refused in the handshake."},
            rdma + tcp);
  v.counter({"tcp.rejected"}, tcp);
  v.counter(kLimitRefusals.series("limits.refused.connections", "connections"),
            over_limit_.load(std::memory_order_relaxed));
  v.counter(
      kLimitRefusals.series("limits.refused.unauthenticated_per_address", "unauthenticated_per_address"),
      over_address_limit_.load(std::memory_order_relaxed));
  v.counter({"connections.evicted_unauthenticated", "rdmabroker_unauthenticated_evicted_total",
             "Unauthenticated connections closed to admit a newer one (limits.max_unauthenticated)."},
            evicted_.load(std::memory_order_relaxed));
  std::int64_t unauthenticated = 0;
  {
    std::lock_guard lock(mu_);
    unauthenticated = static_cast<std::int64_t>(silent_.size() + awaiting_.size());
  }
  v.level("connections.unauthenticated", unauthenticated, "rdmabroker_connections_unauthenticated",
          "Connections that have not authenticated yet (TCP handshakes included).");
}

}  // namespace rdmabroker::daemon
