// SPDX-License-Identifier: Apache-2.0
#include "cluster/interest.hpp"

namespace rdmabroker::daemon {

std::uint32_t ClusterInterest::acquire(std::string_view pattern, std::string_view group) {
  bool added = false;
  std::uint32_t id = 0;
  {
    std::lock_guard lock(mu_);
    auto [it, fresh] = by_key_.try_emplace({std::string(pattern), std::string(group)}, 0);
    if (fresh) {
      it->second = next_id_++;
      by_id_[it->second].entry = Entry{it->second, std::string(pattern), std::string(group)};
      added = true;
    }
    id = it->second;
    ++by_id_[id].subscriptions;
  }
  if (added && notify_) notify_();
  return id;
}

void ClusterInterest::release(std::uint32_t id) {
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;
    if (--it->second.subscriptions == 0) {
      by_key_.erase({it->second.entry.pattern, it->second.entry.group});
      by_id_.erase(it);
      removed = true;
    }
  }
  if (removed && notify_) notify_();
}

ClusterInterest::Snapshot ClusterInterest::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot out;
  out.entries.reserve(by_id_.size());
  for (const auto& [id, counted] : by_id_) out.entries.push_back(counted.entry);
  out.through = next_id_ - 1;
  return out;
}

std::size_t ClusterInterest::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

}  // namespace rdmabroker::daemon
