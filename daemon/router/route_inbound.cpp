// SPDX-License-Identifier: Apache-2.0
// Router: what a route this broker dialed brings back (connection/dialed_route.hpp).
// Each message was published at the route's broker and comes as a PUBLISH
// frame inside a DELIVER on the route's subscription for one interest entry;
// it goes, in place (no copy), to exactly the local subscriptions that entry
// stands for: all of its pattern's, or one member of its queue group (the
// other broker chose this one for the group because it had no member of its
// own), or a stream that takes it (stored as if published here). Never to a
// route's subscription: one hop (SPEC.md §8).
#include <spdlog/spdlog.h>

#include "router/router.hpp"

namespace rdmabroker::daemon {

std::vector<Subscriber> Router::entry_recipients(DialedRoute& route, const DialedRoute::Entry& entry,
                                                 std::string_view subject) {
  std::vector<Subscriber> out;
  Match& match = match_cache_.match(ctx_.core.index, subject);
  // A multicast channel's index entry stands for all of its members.
  auto ours = [&](const Subscriber& s) { return !s.route && s.interest == entry.id; };
  if (entry.group.empty()) {
    for (const Subscriber& s : match.plain)
      if (ours(s)) out.push_back(s);
    return out;
  }
  std::vector<const Subscriber*> members;
  for (const auto& g : match.groups)
    for (const Subscriber& s : g)
      if (ours(s) && is_live(s)) members.push_back(&s);
  if (!members.empty()) out.push_back(*members[route.next_member[entry.id]++ % members.size()]);
  return out;
}

void Router::route_from_peer(Connection& route, std::uint32_t sid, const DialedRoute::Entry& entry,
                             const proto::Frame& f, const BufferRef& buf) {
  ctx_.assert_on_loop();
  DialedRoute& dialed = *route.dialed;
  RouteCounters& counters = *dialed.dial.counters;
  const auto& h = f.header;
  std::vector<Subscriber> recipients;
  RoutedFrame frame = RoutedFrame::of(f);
  DialedRoute::OpenMessage* open = nullptr;
  if (!h.is_fragment()) {
    recipients = entry_recipients(dialed, entry, f.subject);
  } else {
    // Its fragments carry an id of this broker's (a publisher's id there
    // could be a local connection's here), and go to the recipients its
    // first fragment found.
    const auto key = std::pair{sid, h.sequence};
    if (h.offset == 0) {
      auto& m = dialed.open[key];
      m.publisher = ctx_.core.next_connection_id.fetch_add(1);
      m.recipients = entry_recipients(dialed, entry, f.subject);
      std::erase_if(m.recipients, [&](const Subscriber& s) {
        if (s.worker != kChannelWorker && s.worker != kStreamWorker) return false;
        // A channel sequences whole messages into datagrams (SPEC.md §7), and
        // a stream stores whole frames (docs/streams.md).
        counters.dropped.fetch_add(1, std::memory_order_relaxed);
        ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kNeedsFragments)].add();
        return true;
      });
    }
    auto it = dialed.open.find(key);
    if (it == dialed.open.end()) return;  // begun before this route subscribed: not a message here
    open = &it->second;
    proto::store<std::uint64_t>(buf.data() + f.offset + 24, open->publisher);  // the header's sequence
    frame.publisher = open->publisher;
    recipients = open->recipients;
  }
  if (h.starts_message()) {
    counters.messages_in.fetch_add(1, std::memory_order_relaxed);
    ctx_.stats.routed.add(recipients.size());
  }
  if (!h.is_fragment() || h.offset == 0) {
    // Payload bytes of the whole message, counted once (the route's, and its connection's for `stat`).
    const std::uint32_t bytes = h.is_fragment() ? h.arg - h.header_len : h.payload_len - h.header_len;
    counters.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
    ++route.messages_in;
    route.bytes_in += bytes;
  }
  std::optional<std::uint32_t> backlogged;
  for (const Subscriber& s : recipients) {
    if (s.worker == kStreamWorker) {
      // A whole message (a fragment's recipients have no stream), stored as
      // if published here, without an acknowledgement: the publisher's
      // broker answers its own. The engine's backlog paces the route.
      to_stream(s, frame, buf, route, 0);
      if (!backlogged && over_watermark(s)) backlogged = s.slot;
      continue;
    }
    if (route_to(s, frame, buf) && !backlogged && over_watermark(s)) backlogged = s.slot;
  }
  if (open != nullptr && h.ends_message()) dialed.open.erase({sid, h.sequence});
  // A backlogged subscriber holds the route as it would a local publisher:
  // its broker stops at the credits (or the socket's window).
  if (backlogged && route.is_up()) connections_.stall(route, *backlogged);
}

void Router::abort_from_peer(Connection& route, std::uint32_t sid, std::uint64_t publisher) {
  auto node = route.dialed->open.extract({sid, publisher});
  if (node.empty()) return;
  for (const Subscriber& s : node.mapped().recipients) send_to(s, make_abort(s.sid, node.mapped().publisher));
}

void Router::abort_all_from_peer(Connection& route) {
  auto open = std::move(route.dialed->open);
  route.dialed->open.clear();
  for (auto& [key, m] : open)
    for (const Subscriber& s : m.recipients) send_to(s, make_abort(s.sid, m.publisher));
}

}  // namespace rdmabroker::daemon
