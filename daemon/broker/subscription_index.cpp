#include "broker/subscription_index.hpp"

#include <algorithm>
#include <mutex>

namespace rdmabroker::daemon {

void SubscriptionIndex::add(std::string_view subject, const Subscriber& s) {
  std::unique_lock lock(mutex_);
  auto it = by_subject_.find(subject);
  if (it == by_subject_.end()) it = by_subject_.emplace(std::string(subject), std::vector<Subscriber>{}).first;
  it->second.push_back(s);
  ++count_;
}

bool SubscriptionIndex::remove(std::string_view subject, const Subscriber& s) {
  std::unique_lock lock(mutex_);
  auto it = by_subject_.find(subject);
  if (it == by_subject_.end()) return false;
  auto& subs = it->second;
  auto pos = std::find(subs.begin(), subs.end(), s);
  if (pos == subs.end()) return false;
  subs.erase(pos);
  if (subs.empty()) by_subject_.erase(it);
  --count_;
  return true;
}

void SubscriptionIndex::match(std::string_view subject, std::vector<Subscriber>& out) const {
  out.clear();
  std::shared_lock lock(mutex_);
  auto it = by_subject_.find(subject);
  if (it != by_subject_.end()) out.assign(it->second.begin(), it->second.end());
}

std::size_t SubscriptionIndex::size() const {
  std::shared_lock lock(mutex_);
  return count_;
}

}  // namespace rdmabroker::daemon
