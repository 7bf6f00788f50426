// SPDX-License-Identifier: Apache-2.0
// Errors as values: Error carries a category and a message written for the
// person who reads it; Result<T> is a T or an Error. Used on every control path
// of the daemon and in librdmabroker's public API (exceptions never cross it).
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace rdmabroker {

enum class ErrorKind {
  kInvalidArgument,  // the caller passed something unusable (bad URL, subject, size)
  kConnectFailed,    // address/route resolution or the connection attempt failed
  kRejected,         // the broker refused the connection (reason in the message)
  kTimeout,
  kClosed,       // the connection is closed (by the caller, the broker or a failure)
  kBrokerError,  // the broker answered with an ERROR frame
  kResource,     // a verbs or system resource could not be created
  kPayloadTooLarge,
  kNoResponders,          // a request found nobody subscribed to its subject
  kAuthenticationFailed,  // the broker refused the credentials (or their absence)
  kPermissionDenied,      // the user may not publish or subscribe to that subject
  kMessagesLost,          // multicast: messages the broker could no longer resend (on_error only)
  // An acknowledged publish (Client::publish_acked) that no stream stored:
  kNoStream,         // no stream takes the subject
  kStreamFull,       // the stream is at its limits and refuses new messages
  kDiskFull,         // the broker's file system is full (the stream takes messages again when there is room)
  kConsumerInvalid,  // a consumer's settings are out of range, or its durable name is in use with others
};

struct Error {
  ErrorKind kind;
  std::string message;
};

/// A T or an E: Error everywhere but in a part with failures of its own to
/// tell apart (the daemon's message store: daemon/store/store_error.hpp).
template <typename T, typename E = Error>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor): errors-as-values idiom
  Result(E error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }
  const E& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, E> v_;
};

/// Result of an operation that yields nothing but may fail.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }

 private:
  Error error_{ErrorKind::kInvalidArgument, {}};
  bool failed_ = false;
};

}  // namespace rdmabroker
