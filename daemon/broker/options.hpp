// Settings of one broker instance (command-line flags today; docs/usage in
// README and docs/architecture.md explain how they size the verbs resources).
#pragma once

#include <cstdint>
#include <string>

namespace rdmabroker::daemon {

/// Whether the broker serves RDMA: kAuto uses it when a device exists and
/// otherwise runs TCP-only (and says so); kOn refuses to start without it.
enum class RdmaMode { kAuto, kOn, kOff };

struct BrokerOptions {
  std::string listen_address = "0.0.0.0";
  std::uint16_t port = 7470;               // RDMA CM port
  RdmaMode rdma = RdmaMode::kAuto;
  std::string tcp_listen_address;          // empty: listen_address
  std::uint16_t tcp_port = 7471;           // 0: no TCP listener
  std::uint32_t workers = 0;               // 0: one per core, at most 8
  std::uint32_t buffer_size = 16384;       // receive buffer = largest frame, bytes
  std::uint32_t pool_buffers = 8192;       // buffers in the shared pool
  std::uint32_t srq_depth = 1024;          // receives per SRQ (one SRQ per worker and device)
  std::uint32_t credits = 32;              // receive credits granted to each client
  std::uint32_t max_inflight_sends = 8;    // SENDs in flight per connection before batching
  std::uint64_t max_pending_bytes = 64u << 20;  // queued frame bytes per subscriber before it is a slow consumer
  std::uint32_t write_deadline_ms = 2000;  // a subscriber with queued data and no send progress this long is a slow consumer
  std::uint32_t producer_stall_ms = 100;    // credits withheld from a publisher feeding a backlogged subscriber
  std::uint32_t max_connections = 1024;
  std::uint32_t max_subscriptions = 10000; // per connection
  std::uint32_t send_blocks = 4096;        // registered send blocks per worker (headers/control frames)
  std::uint32_t drain_timeout_ms = 2000;   // how long a closing connection may flush its last frames
  std::string admin_socket;                // Unix socket for `rdmabroker stat`; empty: none
};

}  // namespace rdmabroker::daemon
