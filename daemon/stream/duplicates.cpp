// SPDX-License-Identifier: Apache-2.0
#include "stream/duplicates.hpp"

#include "rdmabroker/proto/headers.hpp"

namespace rdmabroker::daemon {

std::string_view msg_id_of(std::span<const std::byte> headers) {
  std::string_view id;
  if (headers.empty()) return id;
  proto::for_each_header(headers, [&](std::string_view name, std::string_view value) {
    if (id.empty() && name == kMsgIdHeader) id = value;
  });
  return id;
}

bool DuplicateWindow::pop_oldest() {
  auto it = ids_.find(order_.front().second);
  // Only if this entry is the id's latest: stored again after its window
  // had passed, the id is remembered from then on.
  const bool erased = it != ids_.end() && it->second.time_ns == order_.front().first;
  if (erased) ids_.erase(it);
  order_.pop_front();
  return erased;
}

void DuplicateWindow::expire(std::int64_t now_ns) {
  while (!order_.empty() && order_.front().first < now_ns - window_ns_) pop_oldest();
}

void DuplicateWindow::evict() {
  while (ids_.size() > max_ids_ && !order_.empty()) {
    if (pop_oldest()) ++evicted_;
  }
}

std::optional<std::uint64_t> DuplicateWindow::find(std::string_view id, std::int64_t now_ns) {
  if (!enabled() || id.empty()) return std::nullopt;
  expire(now_ns);
  if (auto it = ids_.find(id); it != ids_.end()) return it->second.sequence;
  return std::nullopt;
}

void DuplicateWindow::add(std::string_view id, std::uint64_t sequence, std::int64_t time_ns) {
  if (!enabled() || id.empty()) return;
  ids_.insert_or_assign(std::string(id), Stored{sequence, time_ns});
  order_.emplace_back(time_ns, std::string(id));
  evict();
}

void DuplicateWindow::forget_from(std::uint64_t from) {
  // Those are the newest: at the back.
  while (!order_.empty()) {
    auto it = ids_.find(order_.back().second);
    if (it == ids_.end() || it->second.sequence < from) break;
    ids_.erase(it);
    order_.pop_back();
  }
}

}  // namespace rdmabroker::daemon
