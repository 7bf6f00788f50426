// SPDX-License-Identifier: Apache-2.0
#include "reassembly.hpp"

namespace rdmabroker {

void Reassembler::on_fragment(std::uint32_t sid, const proto::Frame& inner, std::uint32_t relay_ns,
                              Deliveries& deliveries) {
  const auto& h = inner.header;
  const auto key = std::pair{sid, h.sequence};
  if (h.arg > proto::kMaxMessageSize) return;  // no broker sends that: not a message we assemble
  if (h.offset == 0) {
    // A first fragment replaces what an earlier message of that publisher
    // left unfinished (the broker sends ABORT first; this is belt and braces).
    auto [it, fresh] = partial_.try_emplace(key);
    if (!fresh) aborted_.fetch_add(1, std::memory_order_relaxed);
    Partial& r = it->second;
    fill_message(r.message, sid, inner);
    r.message.payload.reserve(h.arg - h.header_len);
    r.length = h.arg;
    r.next = h.payload_len;
    return;
  }
  auto it = partial_.find(key);
  // Not begun here (subscribed after its first fragment was routed: the
  // broker sends it none) or out of order (a broker fault): not a message.
  if (it == partial_.end()) return;
  Partial& r = it->second;
  if (h.offset != r.next || h.arg != r.length) {
    partial_.erase(it);
    aborted_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  r.message.payload.insert(r.message.payload.end(), inner.payload.begin(), inner.payload.end());
  r.next += h.payload_len;
  if (r.next == r.length) {
    deliveries.add_owned(sid, relay_ns) = std::move(r.message);
    partial_.erase(it);
  }
}

}  // namespace rdmabroker
