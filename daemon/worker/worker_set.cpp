// SPDX-License-Identifier: Apache-2.0
#include "worker/worker_set.hpp"

namespace rdmabroker::daemon {

void WorkerSet::evict(const Admission::Eviction& e) { workers_[e.worker]->post(EvictCommand{e.connection}); }

void WorkerSet::post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker, Handoff how) {
  // Never a worker's own deliveries (it routes those to its connections
  // directly): deliver_if_asleep() must not take the caller's own turn.
  for (std::size_t w = 0; w < per_worker.size(); ++w) {
    if (per_worker[w].empty()) continue;
    if (how == Handoff::kLend && workers_[w]->deliver_if_asleep(per_worker[w])) {
      per_worker[w].clear();
      continue;
    }
    DeliverCommand cmd;
    cmd.items.swap(per_worker[w]);
    workers_[w]->post(std::move(cmd));
  }
}

std::int64_t WorkerSet::pending_charge_total() const {
  // What is queued, and what is on its way to a queue between workers (a
  // publisher on one worker can route a whole receive batch to another's
  // subscribers before that worker queues any of it). Arrivals are read
  // first: a delivery that lands meanwhile is counted twice, never missed.
  std::int64_t arrived = 0;
  for (const Worker* w : workers_) arrived += static_cast<std::int64_t>(w->stats().transit_charge_in.get());
  std::int64_t total = -arrived;
  for (const Worker* w : workers_) {
    total += queued_charge(w->stats().pending_bytes.get(), w->stats().pending_messages.get()) +
             static_cast<std::int64_t>(w->stats().transit_charge_out.get());
  }
  return total;
}

}  // namespace rdmabroker::daemon
