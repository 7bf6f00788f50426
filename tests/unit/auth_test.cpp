// SPDX-License-Identifier: Apache-2.0
// Identities and the auth table: permission checks (allow/deny for publish,
// covers/meets for subscribe), credential checks against crypt(3) hashes,
// and what a reload does to a connected client's identity.
#include <gtest/gtest.h>

#include <crypt.h>

#include "broker/auth.hpp"

namespace rdmabroker::daemon {
namespace {

std::string hash_of(const std::string& secret) {
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  EXPECT_NE(crypt_gensalt_rn("$6$", 1000, nullptr, 0, setting, sizeof setting), nullptr);
  crypt_data data{};
  return crypt_r(secret.c_str(), setting, &data);
}

config::User user(std::string name, std::string password, config::Permissions p = {}) {
  config::User u;
  u.name = std::move(name);
  u.password_hash = hash_of(password);
  u.permissions = std::move(p);
  return u;
}

TEST(Auth, PublishNeedsAnAllowMatchAndNoDenyMatch) {
  config::Permissions p;
  p.publish = {{"orders.>", "audit.*"}, {"orders.secret", "orders.*.internal"}};
  config::AuthSettings s;
  s.users.push_back(user("alice", "pw", p));
  auto id = AuthTable::build(s)->verify("alice", "pw");
  ASSERT_TRUE(id) << id.error().message;
  const Identity& a = *id.value();
  EXPECT_FALSE(a.publish_unrestricted);
  EXPECT_TRUE(a.may_publish("orders.eu"));
  EXPECT_TRUE(a.may_publish("audit.login"));
  EXPECT_FALSE(a.may_publish("audit.login.failed"));  // '*' is one token
  EXPECT_FALSE(a.may_publish("orders.secret"));
  EXPECT_FALSE(a.may_publish("orders.eu.internal"));
  EXPECT_FALSE(a.may_publish("billing.x"));
  EXPECT_TRUE(a.subscribe_unrestricted);  // defaults: everything
}

TEST(Auth, SubscribeNeedsACoveringAllowAndMeetsNoDeny) {
  config::Permissions p;
  p.subscribe = {{"orders.>"}, {"orders.secret.>"}};
  config::AuthSettings s;
  s.users.push_back(user("alice", "pw", p));
  const auto id = AuthTable::build(s)->verify("alice", "pw").value();
  const Identity& a = *id;
  EXPECT_TRUE(a.may_subscribe("orders.eu"));
  EXPECT_TRUE(a.may_subscribe("orders.*"));     // two tokens: never a secret one
  EXPECT_FALSE(a.may_subscribe("orders.>"));    // would include orders.secret.x
  EXPECT_FALSE(a.may_subscribe("orders.*.x"));  // meets orders.secret.x
  EXPECT_FALSE(a.may_subscribe(">"));           // not covered by orders.>
  EXPECT_FALSE(a.may_subscribe("orders.secret.a"));
}

TEST(Auth, CredentialsAreCheckedAgainstTheHashes) {
  config::AuthSettings s;
  s.users.push_back(user("alice", "correct horse"));
  config::User t;
  t.name = "ingest";
  t.token_hash = hash_of("tok-123");
  s.users.push_back(t);
  auto table = AuthTable::build(s);
  EXPECT_TRUE(table->verify("alice", "correct horse"));
  EXPECT_FALSE(table->verify("alice", "correct horse "));
  EXPECT_FALSE(table->verify("mallory", "correct horse"));
  EXPECT_FALSE(table->verify("ingest", "tok-123"));  // a token is presented without a name
  auto tok = table->verify("", "tok-123");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok.value()->name, "ingest");
  auto anon = table->verify("", "");
  ASSERT_FALSE(anon);
  EXPECT_NE(anon.error().message.find("anonymous access is off"), std::string::npos);
  EXPECT_FALSE(table->nobody_can_connect());
  EXPECT_TRUE(AuthTable::build({})->nobody_can_connect());
}

TEST(Auth, ReloadRenewsPermissionsAndRevokesChangedOrRemovedUsers) {
  config::AuthSettings s;
  s.anonymous = true;
  s.users.push_back(user("alice", "pw"));
  s.users.push_back(user("bob", "pw"));
  auto old_table = AuthTable::build(s);
  auto alice = old_table->verify("alice", "pw").value();
  auto bob = old_table->verify("bob", "pw").value();
  auto anon = old_table->verify("", "").value();

  config::AuthSettings next = s;
  next.users[0].permissions.publish.allow = {"a.>"};
  next.users[1].password_hash = hash_of("new password");  // bob's credential changed
  next.anonymous = false;
  auto table = AuthTable::build(next);
  auto renewed = table->renew(*alice);
  ASSERT_NE(renewed, nullptr);
  EXPECT_FALSE(renewed->may_publish("b.x"));
  EXPECT_EQ(table->renew(*bob), nullptr);
  EXPECT_EQ(table->renew(*anon), nullptr);
  next.users.erase(next.users.begin());
  EXPECT_EQ(AuthTable::build(next)->renew(*alice), nullptr);
}

}  // namespace
}  // namespace rdmabroker::daemon
