// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: the messages one read or completion poll
// decoded, on their way from the transport to the application's callbacks
// and queues (Session::on_frames fills them, Session::dispatch hands them over).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker {

using Clock = std::chrono::steady_clock;

namespace detail {
/// What the library may see of a MessageView that the application may not.
struct __attribute__((visibility("hidden"))) ViewAccess {  // the library's own: not exported
  /// The PUBLISH frame `publish` (of a DELIVER) delivered on `sid`, in place.
  static MessageView of(std::uint32_t sid, const proto::Frame& publish) {
    MessageView v;
    v.sid = sid;
    v.subject = publish.subject;
    v.reply = publish.reply;
    v.payload = publish.payload;
    v.header_block_ = publish.headers;                       // checked when the frame was decoded
    if ((publish.header.flags & proto::kFlagStream) != 0) {  // a consumer's (SPEC.md §3.11)
      v.stream_sequence = publish.header.sequence;
      v.deliveries = publish.header.offset;
    }
    return v;
  }
  /// The owning message a view was made of; null for one in a receive buffer.
  static const Message* message(const MessageView& v) { return v.message_; }
};
}  // namespace detail

/// An application's MessageHandler as the handler the session calls: a view
/// of an owning message (reassembled, or put in order) is handed over as it
/// is; one in a receive buffer is copied into a Message of the calling
/// thread's that keeps its storage, so it allocates nothing once warm.
MessageViewHandler owning_handler(MessageHandler handler);

/// The messages decoded from one read or completion poll, on their way to
/// the application (I/O thread only). Most are seen in place: their views
/// point into the receive buffer, which the transport keeps from the broker
/// until dispatch() has run. The others are owned here: a message reassembled
/// from fragments, or one put in order from a multicast group. Owned messages
/// are kept from batch to batch, so their strings and vectors keep their
/// capacity.
struct Deliveries {
  /// An owned message's payload keeps its capacity up to this (a frame's
  /// worth, and more); a larger one, a large message's, is freed once handed over.
  static constexpr std::size_t kKeptPayloadCapacity = 1u << 20;
  static constexpr std::size_t kInPlace = ~std::size_t{0};
  struct Entry {
    MessageView view;              // in place; or, of an owned message, only its timing
    std::size_t owned = kInPlace;  // the index of the owned message
  };
  std::vector<Entry> entries;
  std::vector<Message> owned;
  std::size_t owned_count = 0;
  /// When the read or completion being decoded was taken (MessageView::received_at).
  std::chrono::steady_clock::time_point received_at{};

  /// `view` as received now, `relay_ns` in the broker (SPEC.md §3.4).
  void add_in_place(MessageView view, std::uint32_t relay_ns) {
    view.received_at = received_at;
    view.relay_time = std::chrono::nanoseconds(relay_ns);
    entries.push_back(Entry{view, kInPlace});
  }
  /// A message to fill (and hand over) on subscription `sid`, completed
  /// now; `relay_ns`: what its last DELIVER said (0: nothing, a datagram's).
  Message& add_owned(std::uint32_t sid, std::uint32_t relay_ns = 0) {
    if (owned_count == owned.size()) owned.emplace_back();
    MessageView timing;
    timing.received_at = received_at;
    timing.relay_time = std::chrono::nanoseconds(relay_ns);
    entries.push_back(Entry{timing, owned_count});
    Message& m = owned[owned_count++];
    m.sid = sid;
    return m;
  }
  std::uint32_t sid(const Entry& e) const { return e.owned == kInPlace ? e.view.sid : owned[e.owned].sid; }
  bool empty() const { return entries.empty(); }
  /// Forgets what was handed over; keeps the storage.
  void clear() {
    for (std::size_t i = 0; i < owned_count; ++i) {
      if (owned[i].payload.capacity() > kKeptPayloadCapacity) std::vector<std::byte>().swap(owned[i].payload);
    }
    owned_count = 0;
    entries.clear();
  }
};

/// `m` as the application gets the PUBLISH frame `publish` (a decoded frame
/// of a DELIVER or a datagram) on subscription `sid`.
inline void fill_message(Message& m, std::uint32_t sid, const proto::Frame& publish) {
  detail::ViewAccess::of(sid, publish).copy_to(m);
}

}  // namespace rdmabroker
