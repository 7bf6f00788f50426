// SPDX-License-Identifier: Apache-2.0
// librdmabroker: reading a stream through a consumer (docs/streams.md,
// "Consumers"; SPEC.md §3.11; a broker of protocol version 11).
//
//   auto c = client->consume("ORDERS", {.durable = "billing"}, 5s).value();
//   while (auto m = c->next(1s)) {
//     handle(*m);
//     c->ack(*m);  // not delivered again
//   }
//
// A consumer is durable (named: its position and what it had not had
// acknowledged survive a restart of the broker and of the client) or
// ephemeral (it ends with its client). Several clients that name one durable
// consumer share it: each message goes to one of them, and what one leaves
// unacknowledged when it goes is delivered to another.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rdmabroker/client.hpp"

#pragma GCC visibility push(default)

namespace rdmabroker {

struct ConsumerOptions {
  /// A durable consumer's name (1 to 64 letters, digits, '-', '_'); empty: ephemeral.
  std::string durable;
  enum class Start {
    kAll,             // from the stream's first message
    kNew,             // only messages stored from now on
    kLast,            // the last message, then the new ones
    kLastPerSubject,  // the last message of each subject, then the new ones (the key-value view)
    kSequence,        // from start_sequence
    kTime,            // from the first message received at or after start_time
  };
  /// Where a new consumer starts; a durable one that exists resumes where it stands.
  Start start = Start::kAll;
  std::uint64_t start_sequence = 0;
  std::chrono::system_clock::time_point start_time{};
  enum class Ack {
    kNone,        // delivered is done (at most once)
    kExplicit,    // each message is acknowledged by ack() (at least once)
    kCumulative,  // ack() acknowledges that message and every earlier one
  };
  Ack ack = Ack::kExplicit;
  /// A message not acknowledged within this is delivered again.
  std::chrono::milliseconds ack_wait{30'000};
  /// Deliveries of one message at most (0: no limit); then it is given up,
  /// and an advisory published on $RB.ADVISORY.MAX_DELIVERIES.<stream>.<consumer>.
  std::uint32_t max_deliver = 0;
  /// Messages delivered and not acknowledged at most (flow control, 1 .. 65,536).
  std::uint32_t max_ack_pending = 1024;
  /// Pull: messages come only as fetch() asks for them; push (false): as
  /// fast as max_ack_pending allows, read with next().
  bool pull = false;
  /// Replay at the pace the messages were received, not as fast as taken.
  bool original_pace = false;
};

class Consumer {
 public:
  virtual ~Consumer() = default;
  /// The subscription id its messages arrive on (Message::sid).
  virtual std::uint32_t sid() const = 0;
  /// Messages of the stream it had yet to deliver when it opened.
  virtual std::uint64_t pending_at_open() const = 0;
  /// A push consumer's next message (stream_sequence and deliveries set);
  /// kTimeout, or kClosed once it or its client closed.
  virtual Result<Message> next(std::chrono::milliseconds timeout) = 0;
  /// A pull consumer: asks for up to `count` messages and returns those
  /// that came within `timeout` (none is not an error).
  virtual Result<std::vector<Message>> fetch(std::size_t count, std::chrono::milliseconds timeout) = 0;
  /// Acknowledges `m` (kCumulative: and every earlier message).
  virtual Status ack(const Message& m) = 0;
  /// Not done with `m`: deliver it again now (to this member or another).
  virtual Status nak(const Message& m) = 0;
  /// Leaves the consumer: what it had not acknowledged goes to another
  /// member, or waits for the next (a durable consumer stays on the broker).
  virtual Status close() = 0;
};

}  // namespace rdmabroker

#pragma GCC visibility pop
