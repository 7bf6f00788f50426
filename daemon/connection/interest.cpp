// SPDX-License-Identifier: Apache-2.0
#include "connection/interest.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "broker/cluster_interest.hpp"
#include "broker/channels.hpp"
#include "broker/streams.hpp"

namespace rdmabroker::daemon {

void add_subscription(WorkerContext& ctx, Connection& c, const proto::Frame& f, std::uint64_t cost) {
  BrokerCore& core = ctx.core;
  const std::uint32_t sid = f.header.arg;
  // In a cluster, a local client's subscription is interest the routes
  // carry to the other brokers; a route's own is not (one hop, SPEC.md §8).
  // The reply field of a SUBSCRIBE names its queue group (SPEC.md §3.3).
  const bool route = c.identity->route;
  std::uint32_t interest = 0;
  if (core.interest != nullptr && !route) {
    interest = core.interest->acquire(f.subject, f.reply);
    c.interest_through = std::max(c.interest_through, interest);
  }
  // An exact subscription (no wildcard, no queue group) of a client to a
  // multicast-backed subject is served by the subject's channel
  // (multicast/engine.hpp). A route's is not: its broker passes what it
  // brings to its own channel.
  if (core.multicast != nullptr && !route && f.reply.empty() && proto::valid_subject(f.subject) &&
      multicast_eligible(ctx.options.multicast, f.subject)) {
    ChannelMember m{c.id, ctx.index, c.slot, sid, c.multicast_capable};
    if (c.multicast_capable) {
      if (const sockaddr* local = c.link->multicast_address(m.device)) {
        std::memcpy(&m.local, local,
                    local->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
      } else {
        m.can_join = false;
      }
    }
    const std::uint32_t channel = core.multicast->subscribe(f.subject, m, interest);
    Subscriber held;
    held.interest = interest;  // given back when the subscription ends
    c.subscriptions.emplace(sid, Connection::Subscription{std::string(f.subject), held, channel, cost});
  } else {
    Subscriber s{ctx.index, c.id, sid, c.slot};
    s.route = route;
    s.interest = interest;
    const Subscriber stored = core.index.add(f.subject, s, f.reply);
    c.subscriptions.emplace(sid, Connection::Subscription{std::string(f.subject), stored, 0, cost});
  }
  // Only now do the other brokers hear of it: what they send for it finds it
  // (announced first, a message could come back before it was in the index
  // and reach nobody, uncounted: issue 49 §6).
  if (interest != 0) core.interest->activate(interest);
}

void drop_subscription(WorkerContext& ctx, Connection& c, const Connection::Subscription& sub,
                       std::uint32_t sid) {
  ctx.core.subscription_budget.give_back(sub.cost);
  if (sub.tenant_charged) c.tenant->subscriptions.give_back(sub.cost);
  if (sub.consumer) {
    // Its messages not acknowledged go to the consumer's other members, or wait for the next.
    ConsumerCommand close;
    close.kind = ConsumerCommand::Kind::kClose;
    close.connection = c.id;
    close.sid = sid;
    ctx.core.streams->command(std::move(close));
    return;
  }
  if (sub.channel != 0) {
    ctx.core.multicast->unsubscribe(sub.channel, c.id, sid);
  } else {
    ctx.core.index.remove(sub.pattern, sub.stored);
  }
  if (sub.stored.interest != 0) ctx.core.interest->release(sub.stored.interest);
}

void drop_all_subscriptions(WorkerContext& ctx, Connection& c) {
  // A closing route frees its broker's place at once: its subscriptions are
  // gone, so the route that replaces it cannot double anything.
  if (c.identity && c.identity->route) ctx.core.route_peers.release(c.identity->route_server, c.id);
  for (const auto& [sid, sub] : c.subscriptions) drop_subscription(ctx, c, sub, sid);
  c.subscriptions.clear();
}

}  // namespace rdmabroker::daemon
