// SPDX-License-Identifier: Apache-2.0
// Streams as the layers below the stream engine see them (docs/streams.md):
// a stream stands in the subscription index for its subjects, like a
// subscriber, and a worker routes each matching publish to it once, in a
// batch posted at the end of its loop turn. The engine (stream/engine.hpp,
// on a thread of its own) stores them; workers never see it.
#pragma once

#include <cstdint>
#include <vector>

#include "broker/buffer_pool.hpp"
#include "broker/routed_frame.hpp"

namespace rdmabroker::daemon {

/// Subscriber::worker of a stream's entries in the subscription index
/// (Subscriber::connection is the stream's id).
inline constexpr std::uint32_t kStreamWorker = ~0u - 1;

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
};

/// Called from any worker.
class StreamCapture {
 public:
  virtual ~StreamCapture() = default;
  /// Messages routed to streams by one worker, in the order it routed them.
  virtual void capture(std::vector<StreamPublish>&& batch) = 0;
};

}  // namespace rdmabroker::daemon
