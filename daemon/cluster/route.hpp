// SPDX-License-Identifier: Apache-2.0
// One route's state, shared by the two halves of Routes: routes.cpp (the
// route thread: connecting, subscriptions, gossip) and routes_inbound.cpp
// (its I/O thread: what comes back). Private to cluster/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cluster/routes.hpp"

namespace rdmabroker::daemon {

/// A route that failed is dialed again after this, doubling up to a few seconds.
inline constexpr auto kRouteFirstRetry = std::chrono::milliseconds(100);

struct Routes::Route {
  Route(std::string u, std::uint64_t id, std::string announced_as = {})
      : url(std::move(u)), publisher_id(id), announced_id(std::move(announced_as)) {}
  const std::string url;
  /// The publisher id its messages in fragments carry here (SPEC.md §3.7):
  /// drawn like a connection's, so no two routes or connections share one.
  const std::uint64_t publisher_id;
  std::unique_ptr<Client> client;                               // null until the first login succeeded
  std::unordered_map<std::uint32_t, std::uint32_t> subscribed;  // interest entry id -> sid there
  RouteState state = RouteState::kConnecting;                   // guarded by Routes::mu_
  /// Not in cluster.routes: the id of the broker that was announced with
  /// this URL (gossip); empty for a configured route. Guarded by mu_.
  std::string announced_id;
  bool forget = false;     // a discovered route that failed: ended and forgotten on the next pass (mu_)
  proto::BrokerInfo peer;  // its broker, as its INFO says (mu_); empty id: no INFO (yet)
  std::chrono::steady_clock::time_point next_attempt{};
  std::chrono::milliseconds retry = kRouteFirstRetry;
  std::string last_error;  // logged when it changes, not on every attempt
  /// A connect under way on `connector` (mu_), and its outcome until this
  /// broker's route thread takes it (mu_).
  bool connecting = false;
  std::optional<Result<std::unique_ptr<Client>>> attempt;
  std::thread connector;
  std::atomic<std::uint64_t> messages_in{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> reconnects{0};
  /// subscribed.size() for status(): `subscribed` itself is the route
  /// thread's, changed while it calls into the library without mu_.
  std::atomic<std::size_t> interest{0};

  // ---- what the client's callbacks use. The poller thread runs them
  // (a polled client), and so does the route thread while it waits on the
  // client (confirm(), a subscribe that waits for a send buffer): the
  // client lets one of them at a time in. `batches` is also handed over by
  // the poller between polls, hence io_mu.
  std::thread poller;
  std::mutex io_mu;
  std::atomic<bool> stopping{false};
  MatchCache match_cache;
  std::vector<std::vector<RemoteDelivery>> batches;              // per worker, posted after each poll
  std::vector<ChannelPublish> channel_batch;                     // for the multicast engine, likewise
  std::unordered_map<std::uint32_t, std::uint32_t> next_member;  // per entry: a group's round robin
  /// The pool buffer messages are copied into, back to back (a 64-byte
  /// message does not hold a 16 KiB buffer), and how much of it is used.
  BufferRef buffer;
  std::uint32_t used = 0;
};

}  // namespace rdmabroker::daemon
