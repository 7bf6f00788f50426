// SPDX-License-Identifier: Apache-2.0
// A reconnecting client's consumer (docs/streams.md, "Consumers and
// reconnects"): it outlives the connection it was opened on. When next()
// or fetch() finds that connection gone, it opens the consumer again on the
// client's next connection, on the application's thread (so a polled
// client's callbacks still run only inside its poll()): a durable consumer
// by name, where the broker has it, so what was not acknowledged is
// delivered again; an ephemeral one from the sequence after the last it
// handed out.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rdmabroker/consumer.hpp"
#include "session.hpp"

namespace rdmabroker {

/// The client's connection of the moment, for the consumers that outlive
/// one: the client posts each new one and its end; a consumer waits here.
class SessionBoard {
 public:
  void set(std::shared_ptr<Session> s);
  /// The client closed, or gave up reconnecting: nothing more will come.
  void end(const Error& why);
  /// A connection other than `gone`, waiting for it up to `deadline`:
  /// kTimeout, or the client's end.
  Result<std::shared_ptr<Session>> next_after(const Session* gone, Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Session> current_;
  std::optional<Error> ended_;
};

/// Wraps `first`, opened on `session`, to open it again after a reconnect.
std::shared_ptr<Consumer> make_reconnecting_consumer(std::shared_ptr<SessionBoard> board, std::string stream,
                                                     ConsumerOptions options,
                                                     std::shared_ptr<Session> session,
                                                     std::shared_ptr<Consumer> first);

}  // namespace rdmabroker
