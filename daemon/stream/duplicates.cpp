// SPDX-License-Identifier: Apache-2.0
#include "stream/duplicates.hpp"

#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "rdmabroker/proto/headers.hpp"
#include "store/crc32c.hpp"

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

namespace {

constexpr std::string_view kSnapshotMagic = "RBDW1\n";

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
bool take(std::string_view& in, T& v) {
  if (in.size() < sizeof v) return false;
  std::memcpy(&v, in.data(), sizeof v);
  in.remove_prefix(sizeof v);
  return true;
}

}  // namespace

// Layout: the magic, then per id u16 length, its bytes, u64 sequence, i64
// time (little-endian, as the store's records), then u32 CRC32C of all
// before it. Binary: a Msg-Id is any bytes but NUL, CR and LF (SPEC.md §3.6).
std::string DuplicateWindow::snapshot() const {
  std::string out(kSnapshotMagic);
  for (const auto& [time, id] : order_) {
    auto it = ids_.find(id);
    if (it == ids_.end() || it->second.time_ns != time) continue;  // not its latest
    put(out, static_cast<std::uint16_t>(id.size()));
    out += id;
    put(out, it->second.sequence);
    put(out, time);
  }
  put(out, store::crc32c(std::as_bytes(std::span(out.data(), out.size()))));
  return out;
}

bool DuplicateWindow::restore(std::string_view bytes, std::int64_t now_ns) {
  if (bytes.size() < kSnapshotMagic.size() + 4 || !bytes.starts_with(kSnapshotMagic)) return false;
  std::uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  std::string_view in = bytes.substr(0, bytes.size() - 4);
  if (store::crc32c(std::as_bytes(std::span(in.data(), in.size()))) != crc) return false;
  in.remove_prefix(kSnapshotMagic.size());
  std::vector<std::tuple<std::string_view, std::uint64_t, std::int64_t>> entries;
  while (!in.empty()) {
    std::uint16_t len = 0;
    std::uint64_t sequence = 0;
    std::int64_t time = 0;
    if (!take(in, len) || in.size() < len) return false;
    const std::string_view id = in.substr(0, len);
    in.remove_prefix(len);
    if (!take(in, sequence) || !take(in, time)) return false;
    entries.emplace_back(id, sequence, time);
  }
  for (const auto& [id, sequence, time] : entries) {
    if (time >= now_ns - window_ns_) add(id, sequence, time);
  }
  return true;
}

}  // namespace rdmabroker::daemon
