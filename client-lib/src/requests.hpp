// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: request/reply. Replies arrive on
// "<inbox>.<n>" through one wildcard subscription per connection, made at
// the first request; each request waits for the answer to its own subject
// (a reply, or the broker's NO_RESPONDERS). Guarded by the session's lock.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "rdmabroker/client.hpp"

namespace rdmabroker {

class PendingRequests {
 public:
  /// An unguessable inbox prefix ("_INBOX." and 16 hex digits), so that no
  /// other client's subscription catches replies by accident.
  static std::string new_inbox();
  const std::string& inbox() const { return inbox_; }
  void set_inbox(std::string inbox) { inbox_ = std::move(inbox); }

  /// A request begins: the reply subject it waits on.
  std::string open();
  /// A reply to `subject`: true if a request waited for it (late or
  /// duplicate answers are dropped).
  bool answer(std::string_view subject, const MessageView& reply);
  /// The broker's NO_RESPONDERS for the request whose reply subject is `subject`.
  bool no_responders(std::string_view subject);
  bool done(const std::string& reply) const {
    auto it = pending_.find(reply);
    return it != pending_.end() && it->second.done;
  }
  struct Outcome {
    bool done = false;
    bool no_responders = false;
    Message reply;
  };
  /// The request ends (answered or not): what it got.
  Outcome close(const std::string& reply);

 private:
  std::string inbox_;
  std::uint64_t next_ = 1;
  std::unordered_map<std::string, Outcome> pending_;  // by reply subject
};

}  // namespace rdmabroker
