// SPDX-License-Identifier: Apache-2.0
#include "rdma/device.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace rdmabroker::daemon {

Result<std::unique_ptr<DeviceSet>> DeviceSet::open(const BufferPool& pool,
                                                   const std::vector<std::string>& only) {
  auto set = std::make_unique<DeviceSet>();
  int n = 0;
  set->list_.reset(rdma_get_devices(&n));
  if (!set->list_ || n == 0) {
    return Error{
        ErrorKind::kResource,
        "no RDMA device found (rdma_get_devices): load a driver (e.g. rdma_rxe) and check `rdma link`"};
  }
  std::vector<std::string> missing = only;
  for (int i = 0; i < n; ++i) {
    ibv_context* context = set->list_.get()[i];
    const std::string name = ibv_get_device_name(context->device);
    if (!only.empty()) {
      if (std::find(only.begin(), only.end(), name) == only.end()) continue;  // not wanted
      std::erase(missing, name);
    }
    auto dev = std::make_unique<Device>();
    dev->index = static_cast<std::uint32_t>(set->devices_.size());
    dev->context = context;
    dev->name = name;
    if (ibv_query_device(dev->context, &dev->attr) != 0) {
      return Error{ErrorKind::kResource, "ibv_query_device(" + dev->name + "): " + std::strerror(errno)};
    }
    dev->pd.reset(ibv_alloc_pd(dev->context));
    if (!dev->pd)
      return Error{ErrorKind::kResource, "ibv_alloc_pd(" + dev->name + "): " + std::strerror(errno)};
    auto region = pool.region();
    dev->pool_mr = verbs::register_local(dev->pd.get(), region.data(), region.size());
    if (!dev->pool_mr) {
      return Error{ErrorKind::kResource,
                   "ibv_reg_mr of the " + std::to_string(region.size()) + "-byte buffer pool on " +
                       dev->name + ": " + std::strerror(errno) +
                       (errno == ENOMEM ? " (raise the memlock limit: ulimit -l / LimitMEMLOCK)" : "")};
    }
    set->devices_.push_back(std::move(dev));
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    return Error{ErrorKind::kInvalidArgument,
                 "devices: no RDMA device named " + names + " (`rdma link` lists them)"};
  }
  return set;
}

int DeviceSet::count() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return 0;
  ibv_free_device_list(list);
  return n;
}

Device* DeviceSet::find(const ibv_context* context) const {
  for (const auto& d : devices_) {
    if (d->context == context) return d.get();
  }
  return nullptr;
}

std::string DeviceSet::names() const {
  std::string s;
  for (const auto& d : devices_) {
    if (!s.empty()) s += ", ";
    s += d->name;
  }
  return s;
}

}  // namespace rdmabroker::daemon
