// SPDX-License-Identifier: Apache-2.0
#include "broker/auth.hpp"

#include <crypt.h>
#include <string.h>

#include <cstring>

#include <algorithm>

#include "rdmabroker/proto/subjects.hpp"

namespace rdmabroker::daemon {

namespace {

/// The credential of a certificate user: the certificate, verified by TLS.
constexpr const char* kCertificateCredential = "x509";

/// A subject, stream name or `STREAM.CONSUMER` under rules: matched by an
/// allow pattern and by no deny pattern.
bool named_allowed(const config::SubjectRules& r, std::string_view name) {
  const auto matches = [&](const std::string& p) { return proto::pattern_matches(p, name); };
  return std::any_of(r.allow.begin(), r.allow.end(), matches) &&
         std::none_of(r.deny.begin(), r.deny.end(), matches);
}

bool unrestricted(const config::SubjectRules& r) {
  return r.deny.empty() && std::find(r.allow.begin(), r.allow.end(), ">") != r.allow.end();
}

std::shared_ptr<const Identity> make_identity(std::string name, bool anonymous, std::string credential,
                                              const config::Permissions& p) {
  auto id = std::make_shared<Identity>();
  id->name = std::move(name);
  id->anonymous = anonymous;
  id->credential = std::move(credential);
  id->permissions = p;
  id->publish_unrestricted = unrestricted(p.publish);
  id->subscribe_unrestricted = unrestricted(p.subscribe);
  return id;
}

/// crypt(3) of `secret` with `hash`'s setting equals `hash`, compared in
/// constant time.
bool hash_matches(std::string_view secret, const std::string& hash) {
  crypt_data data{};
  const std::string s(secret);
  const char* out = crypt_r(s.c_str(), hash.c_str(), &data);
  bool equal = out != nullptr && out[0] != '*' && std::strlen(out) == hash.size();
  if (equal) {
    unsigned char diff = 0;
    for (std::size_t i = 0; i < hash.size(); ++i) diff |= static_cast<unsigned char>(out[i] ^ hash[i]);
    equal = diff == 0;
  }
  explicit_bzero(&data, sizeof data);
  return equal;
}

}  // namespace

bool Identity::may_publish(std::string_view subject) const {
  return publish_unrestricted || named_allowed(permissions.publish, subject);
}

bool Identity::may_subscribe(std::string_view pattern) const {
  if (subscribe_unrestricted) return true;
  const auto& r = permissions.subscribe;
  return std::any_of(r.allow.begin(), r.allow.end(),
                     [&](const std::string& a) { return proto::pattern_covers(a, pattern); }) &&
         std::none_of(r.deny.begin(), r.deny.end(),
                      [&](const std::string& d) { return proto::patterns_intersect(d, pattern); });
}

bool Identity::may_receive_some(std::string_view pattern) const {
  if (subscribe_unrestricted) return true;
  const auto& r = permissions.subscribe;
  return std::any_of(r.allow.begin(), r.allow.end(),
                     [&](const std::string& a) { return proto::patterns_intersect(a, pattern); }) &&
         std::none_of(r.deny.begin(), r.deny.end(),
                      [&](const std::string& d) { return proto::pattern_covers(d, pattern); });
}

bool Identity::may_read_stream(std::string_view name) const {
  return named_allowed(permissions.streams.read, name);
}

bool Identity::may_join(std::string_view stream, std::string_view consumer) const {
  std::string both;
  both.reserve(stream.size() + 1 + consumer.size());
  both.append(stream).append(".").append(consumer);
  return named_allowed(permissions.streams.join, both);
}

std::shared_ptr<const AuthTable> AuthTable::build(const config::AuthSettings& settings) {
  auto t = std::make_shared<AuthTable>();
  if (settings.anonymous)
    t->anonymous_ = make_identity("anonymous", true, "", settings.anonymous_permissions);
  for (const auto& u : settings.users) {
    if (u.certificate) {
      t->by_certificate_.emplace(u.name, make_identity(u.name, false, kCertificateCredential, u.permissions));
    } else if (!u.password_hash.empty()) {
      t->by_name_.emplace(u.name, make_identity(u.name, false, u.password_hash, u.permissions));
    } else {
      t->tokens_.push_back(make_identity(u.name, false, u.token_hash, u.permissions));
    }
  }
  return t;
}

Result<std::shared_ptr<const Identity>> AuthTable::verify(std::string_view user,
                                                          std::string_view secret) const {
  if (user.empty() && secret.empty()) {
    if (anonymous_) return anonymous_;
    return Error{ErrorKind::kRejected, "credentials required (anonymous access is off)"};
  }
  if (!user.empty()) {
    auto it = by_name_.find(std::string(user));
    if (it != by_name_.end() && hash_matches(secret, it->second->credential)) return it->second;
  } else {
    for (const auto& id : tokens_) {
      if (hash_matches(secret, id->credential)) return id;
    }
  }
  return Error{ErrorKind::kRejected, "unknown user, wrong password or unknown token"};
}

Result<std::shared_ptr<const Identity>> AuthTable::verify_certificate(std::string_view name) const {
  if (auto it = by_certificate_.find(std::string(name)); it != by_certificate_.end()) return it->second;
  if (anonymous_) return anonymous_;
  return Error{ErrorKind::kRejected, "no user for the client certificate's CN '" + std::string(name) +
                                         "' (and anonymous access is off)"};
}

std::shared_ptr<const Identity> AuthTable::renew(const Identity& old) const {
  if (old.anonymous) return anonymous_;
  if (old.credential == kCertificateCredential) {
    auto it = by_certificate_.find(old.name);
    return it != by_certificate_.end() ? it->second : nullptr;
  }
  if (auto it = by_name_.find(old.name); it != by_name_.end()) {
    return it->second->credential == old.credential ? it->second : nullptr;
  }
  for (const auto& id : tokens_) {
    if (id->name == old.name && id->credential == old.credential) return id;
  }
  return nullptr;
}

}  // namespace rdmabroker::daemon
