// SPDX-License-Identifier: Apache-2.0
// Every worker of the broker, for what is posted to a worker it does not
// own: the layers below the workers see only its WorkerDispatch side; the
// ones above (the RDMA listener, the multicast engine, the routes, the
// server) post commands to a worker by index or to all of them. Owned by
// the Server; the workers outlive every user of it.
#pragma once

#include <cstdint>
#include <vector>

#include "broker/dispatch.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

class WorkerSet final : public WorkerDispatch {
 public:
  void add(Worker& w) { workers_.push_back(&w); }
  std::uint32_t size() const { return static_cast<std::uint32_t>(workers_.size()); }
  Worker& operator[](std::uint32_t index) const { return *workers_[index]; }

  /// The worker that owns RDMA connection `id`: the listener spreads them
  /// round-robin by id (a TCP connection stays with the worker that accepted it).
  Worker& rdma_owner(std::uint64_t id) const { return *workers_[id % workers_.size()]; }
  /// Posts a copy of `cmd` to every worker.
  template <class C>
  void post_all(const C& cmd) const {
    for (Worker* w : workers_) w->post(cmd);
  }

  void post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker, Handoff how) override;
  void evict(const Admission::Eviction& e) override;
  std::int64_t pending_charge_total() const override;

 private:
  std::vector<Worker*> workers_;
};

}  // namespace rdmabroker::daemon
