// SPDX-License-Identifier: Apache-2.0
// Streams as the layers below the stream engine see them (docs/streams.md):
// a stream stands in the subscription index for its subjects, like a
// subscriber, and a worker routes each matching publish to it once, in a
// batch posted at the end of its loop turn. The engine (stream/engine.hpp,
// on a thread of its own) stores them; workers never see it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "broker/auth.hpp"
#include "broker/buffer_pool.hpp"
#include "broker/routed_frame.hpp"
#include "rdmabroker/proto/consumer.hpp"

namespace rdmabroker::daemon {

/// Subscriber::worker of a stream's entries in the subscription index
/// (Subscriber::connection is the stream's id).
inline constexpr std::uint32_t kStreamWorker = ~0u - 1;

/// A consumer's entry among its connection's subscriptions has this
/// pattern before the stream's name (what it costs in the subscription
/// bounds; not in the index).
inline constexpr std::string_view kConsumerPatternPrefix = "$RB.STREAM.";

/// A routed PUBLISH frame for a stream (a reference to its receive buffer).
struct StreamPublish {
  std::uint32_t stream = 0;
  BufferRef buf;
  RoutedFrame frame;
  std::int64_t received_at = 0;  // steady clock, ns
  /// A PUBLISH with ACK (SPEC.md §3.10): its id (0: none), and where the
  /// PUB_ACK goes: the publisher's connection, its slot and worker.
  std::uint64_t ack_id = 0;
  std::uint64_t publisher = 0;
  std::uint32_t publisher_slot = 0;
  std::uint32_t publisher_worker = 0;
  /// The publisher's protocol version: what its PUB_ACKs may carry (ranges from 12, MSG_ID_INVALID from 13).
  std::uint8_t publisher_version = 0;
  /// What it adds to the engine's backlog (BrokerCore::stream_backlog): 1
  /// for the first message of its receive buffer in the worker's batch, 0
  /// for the next ones, which pin no other buffer.
  std::uint8_t backlog_charge = 1;
};

/// What a client asked of a stream's consumer (SPEC.md §3.11), as its
/// worker passes it on: the engine answers on the client's connection.
struct ConsumerCommand {
  /// kRenew: a reload gave the connection's user new permissions
  /// (`identity`): every delivery from then on passes them.
  enum class Kind { kOpen, kClose, kAck, kNak, kFetch, kRenew };
  Kind kind = Kind::kOpen;
  std::uint64_t connection = 0;  // the client's connection, its slot and worker
  std::uint32_t slot = 0;
  std::uint32_t worker = 0;
  std::uint32_t sid = 0;         // the consumer's subscription id on that connection
  std::uint32_t max_frame = 0;   // kOpen: the client's receive buffer size
  std::string stream;            // kOpen
  std::string durable;           // kOpen: empty for an ephemeral consumer
  proto::ConsumerConfig config;  // kOpen
  std::uint64_t sequence = 0;    // kAck, kNak: the stream sequence; kFetch: how many messages
  std::uint32_t expires_ms = 0;  // kFetch
  /// kOpen, kRenew: who reads (whose permissions each delivery passes).
  std::shared_ptr<const Identity> identity;
};

/// Called from any worker.
class StreamCapture {
 public:
  virtual ~StreamCapture() = default;
  /// Messages routed to streams by one worker, in the order it routed them.
  virtual void capture(std::vector<StreamPublish>&& batch) = 0;
  /// A consumer's command; those of one connection are handled in order.
  virtual void command(ConsumerCommand&& c) = 0;
};

}  // namespace rdmabroker::daemon
