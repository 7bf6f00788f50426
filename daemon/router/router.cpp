// SPDX-License-Identifier: Apache-2.0
#include "router/router.hpp"

#include <algorithm>
#include <optional>

namespace rdmabroker::daemon {

Router::Router(WorkerContext& ctx, Connections& connections) : ctx_(ctx), connections_(connections) {
  connections_.on_message_cut([this](Connection& publisher) {
    if (publisher.dialed) return abort_all_from_peer(publisher);
    abort_open_message(publisher);
  });
}

void Router::route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf) {
  ctx_.assert_on_loop();
  auto& stats = ctx_.stats;
  Match& match = match_cache_.match(ctx_.core.index, f.subject);
  // ACK (SPEC.md §3.10): the stream that takes the subject answers; without one, this worker does.
  const std::uint64_t ack_id = (f.header.flags & proto::kFlagAck) != 0 ? f.header.sequence : 0;
  bool stream_answers = false;
  if (match.empty()) {
    stats.messages_no_subscribers.add();
    if (ack_id != 0) connections_.enqueue(publisher, make_pub_ack(ack_id, proto::ErrorCode::kNoStream));
    if ((f.header.flags & proto::kFlagRequest) != 0) {
      // A request nobody can answer: tell the requester at once instead of
      // letting it wait for its timeout (SPEC.md §3.3, NO_RESPONDERS).
      stats.no_responders.add();
      connections_.enqueue(publisher, make_no_responders(f.reply));
    }
    return;
  }
  stats.routed.add(match.fanout());
  const bool first_fragment = f.header.is_fragment();
  const RoutedFrame frame = RoutedFrame::of(f);  // the one decode, carried from here on
  const Subscriber* backlogged = nullptr;
  bool responder = false;  // a subscriber, not only a stream, took it
  auto deliver = [&](const Subscriber& s) {
    if (first_fragment) {
      if (s.worker == kChannelWorker || s.worker == kStreamWorker) {
        // A channel sequences whole messages into datagrams (SPEC.md §7), and a
        // stream stores whole frames (docs/streams.md): neither takes fragments.
        stats.dropped[static_cast<std::size_t>(DropReason::kNeedsFragments)].add();
        return;
      }
      if (publisher.open_message.open) publisher.open_message.recipients.push_back(s);
    }
    if (s.worker == kStreamWorker) {
      to_stream(s, frame, buf, publisher, ack_id);
      stream_answers = ack_id != 0;
    } else if (!route_to(s, frame, buf)) {
      return;
    } else {
      responder = true;
    }
    if (backlogged == nullptr && stalls(publisher, s)) backlogged = &s;
  };
  for (const Subscriber& s : match.plain) deliver(s);
  for (std::size_t g = 0; g < match.groups.size(); ++g) {
    // One member per message, round robin (docs/subjects.md); a member that
    // this worker already knows to be closing is passed over. In a cluster a
    // local member is preferred: a route's (another broker's members) is
    // chosen only when no local one matches (docs/cluster.md).
    const auto& members = match.groups[g];
    const bool local_member =
        std::any_of(members.begin(), members.end(), [](const Subscriber& s) { return !s.route; });
    const Subscriber* chosen = &match.pick(g);
    for (std::size_t tries = 1;
         tries < 2 * members.size() && (!is_live(*chosen) || (local_member && chosen->route)); ++tries)
      chosen = &match.pick(g);
    deliver(*chosen);
  }
  if (ack_id != 0 && !stream_answers) {
    connections_.enqueue(publisher, make_pub_ack(ack_id, proto::ErrorCode::kNoStream));
  }
  if (!responder && (f.header.flags & proto::kFlagRequest) != 0) {
    // Stored by a stream, but nobody subscribes: a request keeps its meaning
    // (SPEC.md §3.10 rule 2), so the requester hears NO_RESPONDERS too.
    stats.no_responders.add();
    connections_.enqueue(publisher, make_no_responders(f.reply));
  }
  if (backlogged != nullptr) connections_.stall(publisher, backlogged->slot);
}

void Router::to_stream(const Subscriber& s, const RoutedFrame& frame, const BufferRef& buf,
                       const Connection& publisher, std::uint64_t ack_id) {
  // The stream engine's backlog, until stored, counts the receive buffers
  // its messages pin: a buffer once per batch however many messages of it
  // the batch holds (a publisher's SEND carries many).
  const bool same_buffer = !stream_batch_.empty() && stream_batch_.back().buf.data() == buf.data();
  const std::uint8_t charge = same_buffer ? 0 : 1;
  ctx_.core.slots->add_queued(s.slot, charge);
  stream_batch_.push_back({static_cast<std::uint32_t>(s.connection), buf.clone(), frame,
                           ctx_.now.time_since_epoch().count(), ack_id, publisher.id, publisher.slot,
                           ctx_.index, publisher.protocol_version, charge});
}

void Router::route_fragment(Connection& publisher, const proto::Frame& f, const BufferRef& buf) {
  ctx_.assert_on_loop();
  std::optional<std::uint32_t> backlogged_slot;
  const RoutedFrame frame = RoutedFrame::of(f);
  // By index and by value: routing may close the publisher itself (a slow
  // consumer of its own subject), which aborts and clears this list.
  for (std::size_t i = 0; i < publisher.open_message.recipients.size(); ++i) {
    const Subscriber s = publisher.open_message.recipients[i];
    if (route_to(s, frame, buf) && !backlogged_slot && stalls(publisher, s)) backlogged_slot = s.slot;
  }
  if (backlogged_slot && publisher.is_up()) connections_.stall(publisher, *backlogged_slot);
}

void Router::abort_open_message(Connection& publisher) {
  auto recipients = std::move(publisher.open_message.recipients);
  publisher.open_message = {};
  for (const Subscriber& s : recipients) send_to(s, make_abort(s.sid, publisher.id));
}

void Router::send_to(const Subscriber& s, OutItem item) {
  ctx_.assert_on_loop();
  if (s.worker != ctx_.index) {
    remote_[s.worker].push_back({s.connection, s.slot, std::move(item)});
    return;
  }
  if (Connection* c = connections_.find_up(s.connection)) {
    connections_.enqueue(*c, std::move(item));
  } else if (item.header.type == proto::FrameType::kAbort) {
    ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kIncomplete)].add();  // it had begun; it is gone
  }
}

bool Router::over_watermark(const Subscriber& s) const {
  // Stall watermark: three quarters of the bound leaves room for what the
  // publishers already have in flight when they are slowed down. The pool
  // share counts too: half of it, since a subscriber that reaches its share
  // is cut (Connections::over_pool_share). So does the broker-wide bound:
  // above three quarters of it, a subscriber above a quarter of its share
  // of it slows its publishers, since above the bound it would be cut.
  const std::uint64_t bound = ctx_.core.backlog_bound(s.slot, ctx_.options.max_pending_bytes);
  const std::int64_t queued = ctx_.core.slots->queued(s.slot);
  return queued > static_cast<std::int64_t>(bound - bound / 4) ||
         ctx_.core.slots->pins(s.slot) > ctx_.core.pool_shares.share(ctx_.options.pool_share_percent) / 2 ||
         (!ctx_.core.is_engine_slot(s.slot) && connections_.crowds_total(queued, 4, 75));
}

bool Router::is_live(const Subscriber& s) {
  if (s.worker != ctx_.index) return true;  // another worker's (or an engine's): it decides
  return connections_.find_up(s.connection) != nullptr;
}

bool Router::route_to(const Subscriber& s, const RoutedFrame& frame, const BufferRef& buf) {
  const std::int64_t now = ctx_.now.time_since_epoch().count();
  if (s.worker == kChannelWorker) {
    // A multicast channel: its engine sequences the message and fans it out.
    ctx_.core.slots->add_queued(s.slot, 1);  // the engine's backlog (in messages), until it has handled it
    channel_batch_.push_back({static_cast<std::uint32_t>(s.connection), buf.clone(), frame, now});
    return true;
  }
  if (s.worker == ctx_.index) {
    Connection* c = connections_.find_up(s.connection);
    if (c == nullptr) {
      // Counted at the frame that begins the message: if it had begun
      // reaching this subscriber, its close counted it (Connections::drop_queue).
      if (frame.begins) ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add();
      return false;
    }
    ctx_.core.slots->add_queued(s.slot, frame.len);
    connections_.deliver(*c, buf, s.sid, frame);
    return true;
  }
  ctx_.core.slots->add_queued(s.slot, frame.len);
  ctx_.stats.transit_charge_out.add(static_cast<std::uint64_t>(queued_charge(frame.len, 1)));
  auto& batch = remote_[s.worker];
  if (batch.empty() || batch.back().connection != s.connection || !batch.back().in_transit_charge ||
      !extend_delivery(batch.back().item, buf, s.sid, frame, ctx_.options.buffer_size)) {
    batch.push_back({s.connection, s.slot, make_delivery(buf.clone(), s.sid, frame, now), true});
  }
  return true;
}

void Router::post_batches() {
  ctx_.core.workers->post_deliveries(remote_, WorkerDispatch::Handoff::kLend);
  // After the workers' batches: a subject that just moved to a channel must
  // not have its next message overtake, through the engine, the last one
  // this worker routed to a subscriber directly.
  if (!channel_batch_.empty()) ctx_.core.multicast->publish(std::exchange(channel_batch_, {}));
  if (!stream_batch_.empty()) ctx_.core.streams->capture(std::exchange(stream_batch_, {}));
}

}  // namespace rdmabroker::daemon
