// One broker instance: the buffer pool, the devices, the workers and the
// listener, created in that order and torn down in reverse.
#pragma once

#include <memory>
#include <vector>

#include "broker/options.hpp"
#include "broker/stats.hpp"
#include "rdma/buffer_pool.hpp"
#include "rdma/device.hpp"
#include "rdma/listener.hpp"
#include "rdma/worker.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class Broker {
 public:
  /// Opens devices, registers memory, creates workers and the listening id.
  static Result<std::unique_ptr<Broker>> create(const BrokerOptions& options);
  ~Broker();

  void start();
  /// Stops accepting, closes every client (they receive CLOSE), waits for
  /// the workers to drain, joins all threads. Idempotent.
  void stop();

  StatsSnapshot stats() const;
  const BrokerOptions& options() const { return core_.options; }
  std::string device_names() const { return devices_->names(); }

 private:
  Broker() = default;

  BrokerCore core_;
  std::unique_ptr<BufferPool> pool_;   // declaration order = creation order
  std::unique_ptr<DeviceSet> devices_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Listener> listener_;
  bool stopped_ = false;
};

}  // namespace rdmabroker::daemon
