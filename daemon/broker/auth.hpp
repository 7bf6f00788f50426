// SPDX-License-Identifier: Apache-2.0
// Who a connection is and what it may do (docs/security.md).
//
// An AuthTable is built from the config's auth section at start and at every
// reload, and is immutable: the authenticator thread and every worker hold
// the version they were given, and a reload hands each its successor. A
// connection's Identity is shared the same way; a reload renews it (same
// user, same credential: the new permissions) or revokes it.
//
// Checking a password or token is deliberately slow (crypt(3)), so it never
// runs on a worker: the Authenticator (broker/authenticator.hpp) does it on
// its own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <functional>

#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

struct Identity {
  std::string name;  // the user's name, or "anonymous"
  bool anonymous = false;
  std::string credential;  // the hash it authenticated against: a reload that changes it revokes
  config::Permissions permissions;
  bool publish_unrestricted = false;  // allow covers everything, nothing denied: no check per message
  bool subscribe_unrestricted = false;
  /// A route from another broker of the cluster (SPEC.md §8), not a client,
  /// and that broker's id.
  bool route = false;
  std::string route_server;

  /// A PUBLISH to `subject`: an allow pattern matches it and no deny pattern does.
  bool may_publish(std::string_view subject) const;
  /// A SUBSCRIBE to `pattern`: an allow pattern covers all of it and no deny
  /// pattern meets it (so no message it could receive is denied). For a
  /// subject, whether a message on it may be delivered to this user: the
  /// check every consumer delivery passes too (docs/security.md, "Streams").
  bool may_subscribe(std::string_view pattern) const;
  /// Some subject of `pattern` may be delivered to this user: an allow
  /// pattern meets it and no deny pattern covers it.
  bool may_receive_some(std::string_view pattern) const;
  /// Consumers of stream `name` (streams.read).
  bool may_read_stream(std::string_view name) const;
  /// Membership of durable consumer `consumer` of `stream` that another user
  /// owns (streams.join, over `STREAM.CONSUMER`).
  bool may_join(std::string_view stream, std::string_view consumer) const;
  /// Who owns what this identity creates (a durable consumer): the user's
  /// name; every anonymous client is one owner, "" (docs/security.md).
  std::string owner() const { return anonymous ? std::string() : name; }
};

/// One identity's verdicts by subject (may it publish there, may a message
/// on it be delivered to it), remembered so that a hot subject is checked
/// once; bounded, since a client may use any number of subjects. Forgotten
/// when the identity changes (a reload).
class SubjectVerdicts {
 public:
  template <class Check>
  bool get(std::string_view subject, Check&& check) {
    if (auto it = verdicts_.find(subject); it != verdicts_.end()) return it->second;
    if (verdicts_.size() >= kMax) verdicts_.clear();
    const bool ok = check(subject);
    verdicts_.emplace(std::string(subject), ok);
    return ok;
  }
  void clear() { verdicts_.clear(); }

 private:
  static constexpr std::size_t kMax = 1024;
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, bool, Hash, std::equal_to<>> verdicts_;
};

class AuthTable {
 public:
  static std::shared_ptr<const AuthTable> build(const config::AuthSettings& settings);

  /// The identity of a client that presents no credentials, or null when
  /// anonymous access is off.
  const std::shared_ptr<const Identity>& anonymous() const { return anonymous_; }
  /// Checks credentials: a user name and password, or (empty user) a token.
  /// Slow by design: authenticator thread only. The error is what the
  /// client is told; it never says which part was wrong.
  Result<std::shared_ptr<const Identity>> verify(std::string_view user, std::string_view secret) const;
  /// A client without credentials whose verified TLS certificate has CN
  /// `name`: the `certificate: true` user of that name, else anonymous (if on).
  /// Nothing slow: a worker decides it.
  Result<std::shared_ptr<const Identity>> verify_certificate(std::string_view name) const;
  /// After a reload: the identity a connected client now has, or null when
  /// it lost access (user removed, credential changed, anonymous turned off).
  std::shared_ptr<const Identity> renew(const Identity& old) const;
  /// No user and no anonymous access: every client is refused.
  bool nobody_can_connect() const {
    return !anonymous_ && by_name_.empty() && tokens_.empty() && by_certificate_.empty();
  }

 private:
  std::shared_ptr<const Identity> anonymous_;
  std::unordered_map<std::string, std::shared_ptr<const Identity>> by_name_;         // password users
  std::vector<std::shared_ptr<const Identity>> tokens_;                              // token users
  std::unordered_map<std::string, std::shared_ptr<const Identity>> by_certificate_;  // certificate users
};

}  // namespace rdmabroker::daemon
