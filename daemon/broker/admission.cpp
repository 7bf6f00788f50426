#include "broker/admission.hpp"

#include <spdlog/spdlog.h>

#include <string>

namespace rdmabroker::daemon {

std::optional<proto::RejectReason> Admission::check(std::span<const std::byte> request,
                                                    proto::ConnectRequest& out) const {
  switch (proto::decode(request, out)) {
    case proto::HandshakeStatus::kOk:
      break;
    case proto::HandshakeStatus::kBadVersion:
      return proto::RejectReason::kUnsupportedVersion;
    case proto::HandshakeStatus::kBadValue:
      return proto::RejectReason::kBufferTooSmall;
    default:
      return proto::RejectReason::kBadMagic;
  }
  if (out.recv_buffer_size < buffer_size_) return proto::RejectReason::kBufferTooSmall;
  return std::nullopt;
}

std::optional<std::uint32_t> Admission::reserve(bool stopping, proto::RejectReason& why) {
  if (stopping) {
    why = proto::RejectReason::kShuttingDown;
    return std::nullopt;
  }
  auto slot = slots_.acquire();
  if (!slot) {
    why = proto::RejectReason::kTooManyConnections;
    over_limit_.fetch_add(1, std::memory_order_relaxed);
  }
  return slot;
}

void Admission::refuse(Via via, std::string_view peer, std::string_view why,
                       std::optional<proto::RejectReason> reason) {
  // BUFFER_TOO_SMALL is a step of the handshake (the reject names the size,
  // librdmabroker reconnects with it at once), not an event an operator
  // must look at; every other refusal is.
  const auto level =
      reason == proto::RejectReason::kBufferTooSmall ? spdlog::level::info : spdlog::level::warn;
  spdlog::log(level, "{} connection from {} refused: {}", via == Via::kRdma ? "rdma" : "tcp", peer, why);
  // Counted before the peer can see the refusal: whoever reads the counter
  // after being refused must find its refusal in it.
  rejected_[static_cast<std::size_t>(via)].fetch_add(1, std::memory_order_relaxed);
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
}

}  // namespace rdmabroker::daemon
