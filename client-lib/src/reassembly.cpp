// SPDX-License-Identifier: Apache-2.0
#include "reassembly.hpp"

#include <cstring>

namespace rdmabroker {

void Reassembler::on_fragment(std::uint32_t sid, std::uint64_t sequence, const proto::Frame& inner,
                              std::uint32_t relay_ns, Deliveries& deliveries) {
  const auto& h = inner.header;
  const Key key{sid, h.sequence};
  if (h.arg > proto::kMaxMessageSize) return;  // no broker sends that: not a message we assemble
  if (h.offset == 0) {
    // A first fragment replaces what an earlier message of that publisher
    // left unfinished (the broker sends ABORT first; this is belt and braces).
    if (auto old = partial_.find(key); old != partial_.end()) drop(old);
    Partial& r = partial_[key];
    fill_message(r.message, sid, inner);
    r.length = h.arg;
    r.next = h.payload_len;
    r.header_len = h.header_len;
    try_landing(key, sequence, r);
    if (!r.landing) r.message.payload.reserve(h.arg - h.header_len);
    return;
  }
  auto it = partial_.find(key);
  // Not begun here (subscribed after its first fragment was routed: the
  // broker sends it none) or out of order (a broker fault): not a message.
  if (it == partial_.end()) return;
  Partial& r = it->second;
  const std::uint32_t end = h.offset + h.payload_len;  // decode_frame checked it is within arg
  // Landing, the broker WRITEs the fragments it does not send, and every
  // one it sends after the first WRITE is the last (SPEC.md §3.9): what
  // comes is the next, or the last with the bytes before it written.
  const bool in_place = h.offset == r.next || (r.landing && h.offset > r.next && end == r.length);
  if (!in_place || h.arg != r.length) {
    drop(it);
    return;
  }
  auto& payload = r.message.payload;
  if (r.landing) {
    std::memcpy(payload.data() + (h.offset - r.header_len), inner.payload.data(), inner.payload.size());
  } else {
    payload.insert(payload.end(), inner.payload.begin(), inner.payload.end());
  }
  r.next = end;
  if (r.next == r.length) {
    if (r.landing) {
      release(key, r);
      landed_.fetch_add(1, std::memory_order_relaxed);
    }
    deliveries.add_owned(sid, relay_ns) = std::move(r.message);
    partial_.erase(it);
  }
}

void Reassembler::try_landing(const Key& key, std::uint64_t sequence, Partial& r) {
  const std::size_t area = r.length - r.header_len;
  if (host_ == nullptr || landing_min_ == 0 || r.length < landing_min_) return;
  // The connect request said LANDING: every such first fragment is answered,
  // with no area (address and rkey 0) when none is to be had; the broker
  // then sends the rest as fragments, as to any client.
  proto::LandingArea none;
  none.publisher = key.second;
  if (landings_ != 0 && (landings_ >= kMaxLandings || landing_bytes_ + area > kMaxLandingBytes)) {
    host_->send_ready(key.first, sequence, none);
    return;
  }
  auto& payload = r.message.payload;
  const std::size_t first = payload.size();
  payload.resize(area);
  const auto rkey = host_->expose_for_write(key.first, key.second, payload.data(), area);
  if (!rkey) {
    payload.resize(first);
    host_->send_ready(key.first, sequence, none);
    return;
  }
  r.landing = true;
  ++landings_;
  landing_bytes_ += area;
  // The broker writes byte o of the message at address + o: the header
  // block, which the first fragment brought whole, is not in the area.
  proto::LandingArea a;
  a.publisher = key.second;
  a.address = reinterpret_cast<std::uint64_t>(payload.data()) - r.header_len;
  a.rkey = *rkey;
  host_->send_ready(key.first, sequence, a);
}

void Reassembler::release(const Key& key, Partial& r) {
  if (!r.landing) return;
  host_->release_landing(key.first, key.second);
  r.landing = false;
  --landings_;
  landing_bytes_ -= r.length - r.header_len;
}

void Reassembler::drop(std::map<Key, Partial>::iterator it) {
  release(it->first, it->second);
  partial_.erase(it);
  aborted_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace rdmabroker
