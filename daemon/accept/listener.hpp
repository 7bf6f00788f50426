// SPDX-License-Identifier: Apache-2.0
// The CM thread: owns the listening cm_ids (the clients', and the routes' if
// cluster.listen_rdma is set) and their event channel, validates
// each connect request's handshake, and hands the new cm_id to a worker
// (rdma_migrate_id onto the worker's own event channel, then an
// AcceptCommand). It also watches every device's asynchronous event fd and
// forwards QP errors to the worker that owns the QP.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "rdma/device.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/result.hpp"
#include "worker/worker_set.hpp"

namespace rdmabroker::daemon {

class Listener {
 public:
  Listener(BrokerCore& core, const DeviceSet& devices, WorkerSet& workers)
      : core_(core), devices_(devices), workers_(workers) {}
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// Binds and listens (calling thread); the error names the address.
  Status listen();
  void start();
  /// Stops accepting: further connect requests are refused, the thread exits.
  void stop();

 private:
  void run();
  void on_connect_request(rdma_cm_event* ev);
  void on_async_event(Device& dev);
  void reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer);
  /// A listening cm_id on channel_ bound to address:port; the error names it.
  Result<verbs::CmIdPtr> listen_on(const std::string& address, std::uint16_t port);

  BrokerCore& core_;
  const DeviceSet& devices_;
  WorkerSet& workers_;
  verbs::EventChannelPtr channel_;
  verbs::CmIdPtr listen_id_;        // after channel_: destroyed first
  verbs::CmIdPtr route_listen_id_;  // cluster.listen_rdma; null: none
  UniqueFd stop_fd_;
  std::thread thread_;
};

/// "a.b.c.d:port" of the peer of a cm_id.
std::string peer_address(rdma_cm_id* id);

}  // namespace rdmabroker::daemon
