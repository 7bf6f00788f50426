// SPDX-License-Identifier: Apache-2.0
// A connection's interest: its subscriptions, each entered in the broker's
// subscription index or, for an exact subject served by hardware multicast,
// in that subject's channel (multicast/engine.hpp). Every subscription holds
// its share of the broker-wide subscription budget until it ends.
#pragma once

#include <cstdint>

#include "connection/connection.hpp"
#include "connection/worker_context.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

/// Adds SUBSCRIBE `f` of `c` (its sid free, its permission and limits
/// checked) to the index or its subject's multicast channel. `cost` was taken
/// from the broker-wide budget for it.
void add_subscription(WorkerContext& ctx, Connection& c, const proto::Frame& f, std::uint64_t cost);
/// Ends one subscription of `c` (the caller erases it from c.subscriptions).
void drop_subscription(WorkerContext& ctx, Connection& c, const Connection::Subscription& sub,
                       std::uint32_t sid);
/// Ends every subscription of `c`.
void drop_all_subscriptions(WorkerContext& ctx, Connection& c);

}  // namespace rdmabroker::daemon
