// SPDX-License-Identifier: Apache-2.0
// Routing and fan-out on one worker, with no transport in sight: a PUBLISH
// is matched against the subscription index (through this worker's match
// cache) and queued for each subscriber: on this worker's own connections
// directly (Connections::deliver), for another worker's in a batch posted to
// it at the end of the loop turn, for a multicast channel in a batch for the
// engine. Queue groups get one member per message, round robin. A request
// nobody serves is answered NO_RESPONDERS; a publisher feeding a backlogged
// subscriber is stalled (Connections::stall). A message sent as fragments
// (SPEC.md §3.7) is matched once, at its first fragment; the rest follow the
// recipients pinned then, each fragment forwarded as it arrives.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "connection/connections.hpp"
#include "connection/dialed_route.hpp"
#include "connection/worker_context.hpp"
#include "broker/channels.hpp"
#include "broker/routed_frame.hpp"
#include "broker/streams.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

class Router {
 public:
  /// Registers with `connections` to abort a closing publisher's open message.
  Router(WorkerContext& ctx, Connections& connections);

  /// How many workers there are (known once all exist): one batch each.
  void set_worker_count(std::size_t n) { remote_.resize(n); }

  /// Routes PUBLISH frame `f` of `publisher`, received in `buf`. The frame
  /// was size-checked (proto::max_publish_frame), so every DELIVER built
  /// from it fits a subscriber's buffer.
  void route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf);
  /// Routes a fragment after the first of `publisher`'s open message to the
  /// recipients its first fragment was routed to.
  void route_fragment(Connection& publisher, const proto::Frame& f, const BufferRef& buf);
  /// Ends `publisher`'s open message unfinished: each recipient gets ABORT
  /// after the fragments it was sent (the message counts as dropped, reason
  /// "incomplete", for each recipient that had fragments of it queued:
  /// Connections::enqueue).
  void abort_open_message(Connection& publisher);

  // router/route_inbound.cpp
  /// PUBLISH frame `f` (its offset in `buf`) that dialed route `route`
  /// brought in a DELIVER on its subscription `sid`, for interest entry
  /// `entry`: to the local subscriptions the entry stands for, in place. A
  /// fragment's sequence is rewritten in `buf` to this broker's id for it.
  void route_from_peer(Connection& route, std::uint32_t sid, const DialedRoute::Entry& entry,
                       const proto::Frame& f, const BufferRef& buf);
  /// ABORT from a route's broker: its message in fragments on `sid` from `publisher` ends unfinished.
  void abort_from_peer(Connection& route, std::uint32_t sid, std::uint64_t publisher);
  /// The route closes: every message in fragments it was forwarding ends unfinished.
  void abort_all_from_peer(Connection& route);

  /// Hands the batches for other workers and the multicast engine over
  /// (once per loop turn, before the flush).
  void post_batches();
  /// What route_publish() batched for worker `w` (tests).
  const std::vector<RemoteDelivery>& batch_for(std::uint32_t w) const { return remote_[w]; }

 private:
  /// Queues PUBLISH frame `frame` of `buf` for `s`, locally or through its
  /// worker; false if it went nowhere (counted).
  bool route_to(const Subscriber& s, const RoutedFrame& frame, const BufferRef& buf);
  /// Hands PUBLISH frame `frame` of `buf` to stream `s` (its engine's batch),
  /// with the PUBLISH's ACK id (0: none) and who gets the PUB_ACK.
  void to_stream(const Subscriber& s, const RoutedFrame& frame, const BufferRef& buf,
                 const Connection& publisher, std::uint64_t ack_id);
  /// Queues control frame `item` for `s` behind what was routed to it.
  void send_to(const Subscriber& s, OutItem item);
  /// Whether `s`'s queue is above the stall watermark.
  bool over_watermark(const Subscriber& s) const;
  /// Whether `s` stalls `publisher` now: above the watermark, unless the
  /// publisher is taking what a stall for `s` held in vain (stall_waived_slot).
  bool stalls(const Connection& publisher, const Subscriber& s) const {
    return s.slot != publisher.stall_waived_slot && over_watermark(s);
  }
  /// False only for a subscriber of this worker that is gone or closing.
  bool is_live(const Subscriber& s);
  /// The local subscriptions interest entry `entry` stands for that match
  /// `subject`: all of its pattern's, or one member of its queue group.
  std::vector<Subscriber> entry_recipients(DialedRoute& route, const DialedRoute::Entry& entry,
                                           std::string_view subject);

  WorkerContext& ctx_;
  Connections& connections_;
  MatchCache match_cache_;                           // this worker's recent subject -> subscribers results
  std::vector<std::vector<RemoteDelivery>> remote_;  // per target worker
  std::vector<ChannelPublish> channel_batch_;        // for the multicast engine, posted after remote_
  std::vector<StreamPublish> stream_batch_;          // for the stream engine, posted last
};

}  // namespace rdmabroker::daemon
