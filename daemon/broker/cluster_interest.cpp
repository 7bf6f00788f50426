// SPDX-License-Identifier: Apache-2.0
#include "broker/cluster_interest.hpp"

#include <algorithm>

namespace rdmabroker::daemon {

std::uint32_t ClusterInterest::acquire(std::string_view pattern, std::string_view group) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = by_key_.try_emplace({std::string(pattern), std::string(group)}, 0);
  if (fresh) {
    it->second = next_id_++;
    by_id_[it->second].entry = Entry{it->second, std::string(pattern), std::string(group)};
  }
  ++by_id_[it->second].subscriptions;
  return it->second;
}

void ClusterInterest::activate(std::uint32_t id) {
  // Announced only now: the other brokers send what matches as soon as they
  // hear of it, and it must find the subscription that asked for it.
  bool announced = false;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it != by_id_.end() && !it->second.active) announced = it->second.active = true;
  }
  if (announced && notify_) notify_();
}

void ClusterInterest::release(std::uint32_t id) {
  bool removed = false;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;
    if (--it->second.subscriptions == 0) {
      removed = it->second.active;  // one never announced goes without a word
      by_key_.erase({it->second.entry.pattern, it->second.entry.group});
      by_id_.erase(it);
    }
  }
  if (removed && notify_) notify_();
}

ClusterInterest::Snapshot ClusterInterest::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot out;
  out.entries.reserve(by_id_.size());
  // An entry not yet active holds `through` below it: "in effect at every
  // route" (set_synced) must not cover an entry the routes have not seen.
  out.through = next_id_ - 1;
  for (const auto& [id, counted] : by_id_) {
    if (counted.active) {
      out.entries.push_back(counted.entry);
    } else {
      out.through = std::min(out.through, id - 1);
    }
  }
  return out;
}

std::uint32_t ClusterInterest::through() const {
  std::lock_guard lock(mu_);
  std::uint32_t through = next_id_ - 1;
  for (const auto& [id, counted] : by_id_)
    if (!counted.active) through = std::min(through, id - 1);
  return through;
}

std::size_t ClusterInterest::size() const {
  std::lock_guard lock(mu_);
  return by_id_.size();
}

}  // namespace rdmabroker::daemon
