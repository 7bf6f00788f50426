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
  /// pattern meets it (so no message it could receive is denied).
  bool may_subscribe(std::string_view pattern) const;
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
