#include "router/router.hpp"

namespace rdmabroker::daemon {

void Router::route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf) {
  ctx_.assert_on_loop();
  auto& stats = ctx_.stats;
  Match& match = match_cache_.match(ctx_.core.index, f.subject);
  if (match.empty()) {
    stats.messages_no_subscribers.add();
    if ((f.header.flags & proto::kFlagRequest) != 0) {
      // A request nobody can answer: tell the requester at once instead of
      // letting it wait for its timeout (SPEC.md §3.3, NO_RESPONDERS).
      stats.no_responders.add();
      connections_.enqueue(publisher, make_no_responders(f.reply));
    }
    return;
  }
  stats.routed.add(match.fanout());
  // Stall watermark: three quarters of the bound leaves room for what the
  // publishers already have in flight when they are slowed down.
  auto watermark = [&](std::uint32_t slot) {
    const std::uint64_t bound = ctx_.core.backlog_bound(slot, ctx_.options.max_pending_bytes);
    return static_cast<std::int64_t>(bound - bound / 4);
  };
  const Subscriber* backlogged = nullptr;
  auto deliver = [&](const Subscriber& s) {
    if (!route_to(s, f, buf)) return;
    if (backlogged == nullptr && ctx_.core.slots->queued(s.slot) > watermark(s.slot)) backlogged = &s;
  };
  for (const Subscriber& s : match.plain) deliver(s);
  for (std::size_t g = 0; g < match.groups.size(); ++g) {
    // One member per message, round robin (docs/subjects.md); a member that
    // this worker already knows to be closing is passed over.
    const Subscriber* chosen = &match.pick(g);
    for (std::size_t tries = 1; tries < match.groups[g].size() && !is_live(*chosen); ++tries)
      chosen = &match.pick(g);
    deliver(*chosen);
  }
  if (backlogged != nullptr) connections_.stall(publisher, backlogged->slot);
}

bool Router::is_live(const Subscriber& s) {
  if (s.worker != ctx_.index) return true;  // another worker's: it decides
  return connections_.find_up(s.connection) != nullptr;
}

bool Router::route_to(const Subscriber& s, const proto::Frame& f, const BufferRef& buf) {
  const auto off = static_cast<std::uint32_t>(f.offset);
  const auto len = static_cast<std::uint32_t>(f.header.frame_len());
  const std::int64_t now = ctx_.now.time_since_epoch().count();
  if (s.worker == kChannelWorker) {
    // A multicast channel: its engine sequences the message and fans it out.
    ctx_.core.slots->add_queued(s.slot, 1);  // the engine's backlog (in messages), until it has handled it
    channel_batch_.push_back(
        {static_cast<std::uint32_t>(s.connection), buf.clone(), off, len, f.header.payload_len, now});
    return true;
  }
  if (s.worker == ctx_.index) {
    Connection* c = connections_.find_up(s.connection);
    if (c == nullptr) {
      ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add();
      return false;
    }
    ctx_.core.slots->add_queued(s.slot, len);
    connections_.deliver(*c, buf, s.sid, off, len, f.header.payload_len);
    return true;
  }
  ctx_.core.slots->add_queued(s.slot, len);
  auto& batch = remote_[s.worker];
  if (batch.empty() || batch.back().connection != s.connection ||
      !extend_delivery(batch.back().item, buf, s.sid, off, len, f.header.payload_len,
                       ctx_.options.buffer_size)) {
    batch.push_back(
        {s.connection, s.slot, make_delivery(buf.clone(), s.sid, off, len, f.header.payload_len, now)});
  }
  return true;
}

void Router::post_batches() {
  ctx_.core.post_deliveries(remote_);
  // After the workers' batches: a subject that just moved to a channel must
  // not have its next message overtake, through the engine, the last one
  // this worker routed to a subscriber directly.
  if (!channel_batch_.empty()) ctx_.core.multicast->publish(std::exchange(channel_batch_, {}));
}

}  // namespace rdmabroker::daemon
