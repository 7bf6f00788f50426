// SPDX-License-Identifier: Apache-2.0
// Multicast channels as the layers below the engine see them: a subject
// served by hardware multicast has a channel, which stands in the
// subscription index for all of its subscribers (multicast/engine.hpp
// implements it, on a thread of its own). Workers add and remove members,
// route messages to it and pass on what clients say about the group; they
// never see the engine.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "broker/buffer_pool.hpp"
#include "broker/routed_frame.hpp"
#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/proto/subjects.hpp"

namespace rdmabroker::daemon {

/// Subscriber::worker of a channel's entry in the subscription index.
inline constexpr std::uint32_t kChannelWorker = ~0u;

/// One subscription served by a channel, as its worker describes it.
struct ChannelMember {
  std::uint64_t connection = 0;
  std::uint32_t worker = 0;
  std::uint32_t slot = 0;
  std::uint32_t sid = 0;
  bool can_join = false;     // an RDMA client that offered multicast (kConnectMulticast)
  std::uint32_t device = 0;  // the broker device its RC connection is on (can_join only)
  sockaddr_storage local{};  // the broker's address on that connection: binds the device's UD endpoint
};

/// A routed PUBLISH frame for a channel (zero-copy: a reference to the receive buffer).
struct ChannelPublish {
  std::uint32_t channel = 0;
  BufferRef buf;
  RoutedFrame frame;
  std::int64_t received_at = 0;
};

/// Whether an exact subscription to `subject` is served by a channel, per
/// `settings` (the caller's copy: workers take reloads at their own pace).
inline bool multicast_eligible(const config::MulticastSettings& settings, std::string_view subject) {
  if (!settings.enabled) return false;
  return std::any_of(settings.subjects.begin(), settings.subjects.end(),
                     [&](const std::string& p) { return proto::pattern_matches(p, subject); });
}

/// Called from any worker.
class MulticastChannels {
 public:
  virtual ~MulticastChannels() = default;
  /// Adds the member to `subject`'s channel (created, and entered in the
  /// subscription index, for its first member). Returns the channel id.
  /// `interest`: the subject's ClusterInterest entry (0: no cluster), which
  /// the channel's index entry carries so that what a route brings for that
  /// entry reaches the channel (cluster/routes.hpp); the same for every
  /// member while the channel lives, since each member holds the entry.
  virtual std::uint32_t subscribe(std::string_view subject, const ChannelMember& member,
                                  std::uint32_t interest) = 0;
  /// Removes a member; the channel goes (index entry, group) with its last.
  virtual void unsubscribe(std::uint32_t channel, std::uint64_t connection, std::uint32_t sid) = 0;
  /// Messages routed to channels by one worker, in the order it routed them.
  virtual void publish(std::vector<ChannelPublish>&& batch) = 0;
  /// A client's MCAST_JOINED: `error` empty when it joined.
  virtual void joined(std::uint64_t connection, std::uint32_t sid, std::uint64_t epoch,
                      std::string error) = 0;
  /// A client's MCAST_REPAIR.
  virtual void repair(std::uint64_t connection, std::uint32_t sid, std::uint64_t first,
                      std::uint64_t count) = 0;
};

}  // namespace rdmabroker::daemon
