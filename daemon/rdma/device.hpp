// SPDX-License-Identifier: Apache-2.0
// The RDMA devices the broker serves on: one PD per device and the buffer pool
// registered once on each (local write only: nothing is ever exposed to
// remote read or write, see docs/security notes in docs/architecture.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "broker/buffer_pool.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

struct Device {
  std::uint32_t index = 0;
  ibv_context* context = nullptr;  // owned by DeviceSet's rdma_cm device list
  std::string name;
  ibv_device_attr attr{};
  verbs::PdPtr pd;
  verbs::MrPtr pool_mr;  // declared after pd: deregistered before the PD goes
};

class DeviceSet {
 public:
  /// Opens the RDMA devices rdma_cm knows (only those named in `only`, when
  /// it is not empty) and registers `pool` on each. Fails if there is none,
  /// or if a named device does not exist.
  static Result<std::unique_ptr<DeviceSet>> open(const BufferPool& pool,
                                                 const std::vector<std::string>& only = {});
  /// RDMA devices present (0 on a host without an RDMA stack); opens nothing.
  static int count();

  Device* find(const ibv_context* context) const;
  const std::vector<std::unique_ptr<Device>>& devices() const { return devices_; }
  std::string names() const;

 private:
  verbs::DeviceListPtr list_;  // first member: released after every PD and MR
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace rdmabroker::daemon
