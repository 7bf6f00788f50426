// SPDX-License-Identifier: Apache-2.0
// The multicast side of a Session (SPEC.md §7): the transport's join
// answers, datagrams from the groups and the repairs of gaps, through the
// session's sequenced streams (multicast_streams.hpp), and the control
// frames the I/O loop sends for them.
#include "session.hpp"

namespace rdmabroker {

using proto::FrameType;

void Session::join_done(std::uint32_t sid, std::uint64_t epoch, const std::string& error) {
  if (!error.empty()) join_failures_.fetch_add(1, std::memory_order_relaxed);
  const auto text = as_payload(std::string_view(error).substr(0, proto::kMaxMcastReasonLen));
  // Its sequence is the MCAST_JOIN's: it names the join it answers.
  send_from_io(sid, FrameType::kMcastJoined, epoch, {text.begin(), text.end()});
}

void Session::send_from_io(std::uint32_t sid, proto::FrameType type, std::uint64_t sequence,
                           std::vector<std::byte> payload) {
  std::unique_lock lock(mu_);
  proto::FrameHeader h;
  h.type = type;
  h.arg = sid;
  if (deferred_.empty() && append_frame_locked(lock, h, {}, {}, payload, sequence, false)) return;
  if (!closed_) deferred_.push_back({sid, type, sequence, std::move(payload)});
}

void Session::on_datagram(std::span<const std::byte> datagram, Deliveries& deliveries) {
  deliveries.received_at = std::chrono::steady_clock::now();
  streams_.on_datagram(datagram, recv_buffer_size_, deliveries);
}

void Session::send_deferred() {
  // Frames the I/O thread could not queue earlier, in their order.
  std::unique_lock lock(mu_);
  std::size_t sent = 0;
  for (; sent < deferred_.size(); ++sent) {
    const DeferredFrame& d = deferred_[sent];
    proto::FrameHeader h;
    h.type = d.type;
    h.arg = d.sid;
    if (closed_ || !append_frame_locked(lock, h, {}, {}, d.payload, d.sequence, false)) break;
  }
  deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(sent));
  if (closed_) deferred_.clear();
}

int Session::check_gaps() {
  if (!deferred_.empty()) send_deferred();
  if (streams_.empty()) return deferred_.empty() ? -1 : 1;
  // Subscriptions that ended (unsubscribed, refused, or the session
  // closed): their streams and groups go.
  const auto ended = streams_.forget_ended([this](std::uint32_t sid) {
    std::lock_guard lock(mu_);
    return subs_.contains(sid);
  });
  for (auto sid : ended) transport_->leave_group(sid);
  std::vector<SequencedStreams::Repair> repairs;
  int due = streams_.due_repairs(Clock::now(), repairs);
  for (const auto& r : repairs) {
    const auto bytes = proto::encode_count(r.count);
    send_from_io(r.sid, FrameType::kMcastRepair, r.first, {bytes.begin(), bytes.end()});
  }
  if (!deferred_.empty()) due = 1;
  return due;
}

}  // namespace rdmabroker
