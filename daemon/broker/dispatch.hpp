// SPDX-License-Identifier: Apache-2.0
// How the layers below the workers hand work to a worker they do not own:
// the narrow interface that the worker layer implements (worker/worker_set.hpp).
// The router posts what it routed to other workers' connections; admission's
// evictions go to the connection's owner; the pending-bytes bound reads
// every worker's queues. Nothing below the workers holds a worker.
#pragma once

#include <cstdint>
#include <vector>

#include "broker/admission.hpp"
#include "broker/outbound.hpp"

namespace rdmabroker::daemon {

/// Deliveries routed on one worker (or the multicast engine, or a route) to
/// another worker's connection.
struct RemoteDelivery {
  std::uint64_t connection = 0;
  std::uint32_t slot = 0;
  OutItem item;
  /// Routed by a worker, which counted its charge in its transit_charge_out
  /// (WorkerStats): the receiving worker counts it in when it arrives. The
  /// engines' deliveries (multicast, stream consumers) are not counted.
  bool in_transit_charge = false;
};

class WorkerDispatch {
 public:
  virtual ~WorkerDispatch() = default;
  /// How a batch reaches a worker: `kLend`, made by the calling thread on
  /// the worker's behalf while it sleeps (Worker::deliver_if_asleep: no
  /// wake-up), else queued; `kQueue`, always queued for the worker's own
  /// thread (it wakes), so that the caller goes back to its own work.
  enum class Handoff { kLend, kQueue };
  /// Posts each worker its deliveries (one DeliverCommand per worker with
  /// any) and leaves `per_worker` empty. Never a worker's own deliveries:
  /// it routes those to its connections directly.
  virtual void post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker, Handoff how) = 0;
  /// Posts the eviction Admission::reserve() chose to the worker that owns the connection.
  virtual void evict(const Admission::Eviction& e) = 0;
  /// What queued deliveries on every worker are charged against
  /// limits.max_pending_bytes_total: frame bytes + kQueuedMessageCharge per message.
  virtual std::int64_t pending_charge_total() const = 0;
};

}  // namespace rdmabroker::daemon
