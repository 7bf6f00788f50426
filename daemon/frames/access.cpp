// SPDX-License-Identifier: Apache-2.0
// Authentication and permissions on a worker (docs/security.md): the CONNECT
// a connection must send first, the authenticator's verdict, the checks on
// PUBLISH and SUBSCRIBE, and what a reload changes for connected clients.
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include "frames/frame_handler.hpp"
#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/config/config.hpp"
#include "rdmabroker/proto/info.hpp"
#include "connection/interest.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

bool FrameHandler::before_authentication(Connection& c, const proto::Frame& f) {
  switch (f.header.type) {
    case FrameType::kConnect: {
      if (c.state != ConnState::kAwaitingConnect) break;
      const auto* p = reinterpret_cast<const char*>(f.payload.data());
      const std::string_view user(p, f.header.arg);
      const std::string_view secret(p + f.header.arg, f.payload.size() - f.header.arg);
      c.state = ConnState::kVerifying;
      const bool route = (f.header.flags & proto::kFlagRoute) != 0;
      if (route != c.route_listener && (c.route_listener || ctx_.core.options.cluster.has_route_listener())) {
        // Routes and clients each have their door (cluster.listen_rdma/listen_tcp):
        // a firewall between them means what it says (docs/cluster.md).
        AuthResultCommand verdict{
            c.id, nullptr,
            route ? "route refused: this broker takes routes on its route listener (cluster.listen_rdma, "
                    "cluster.listen_tcp), not on a client port"
                  : "this port takes routes only (cluster.listen_rdma, cluster.listen_tcp): clients connect "
                    "to listen.rdma or listen.tcp"};
        on_auth_result(verdict);  // counted and logged (throttled) as a failed login
        return false;
      }
      if (route) {
        if (c.protocol_version < proto::kRouteVersion) {
          connections_.close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
                             "flag not allowed: ROUTE needs protocol version " +
                                 std::to_string(proto::kRouteVersion) + ", this connection negotiated " +
                                 std::to_string(c.protocol_version));
          return false;
        }
        // Version 7: the dialing broker's id, then its route URLs (SPEC.md §8, "Gossip").
        proto::BrokerInfo dialer = c.protocol_version >= proto::kGossipVersion
                                       ? proto::split_route_login(f.reply)
                                       : proto::BrokerInfo{std::string(f.reply), {}, {}};
        std::string bad = dialer.id.empty() ? "a route login's second string is its broker's id, then each "
                                              "route URL after a comma"
                          : !proto::valid_broker_id(dialer.id)
                              ? "a route login's broker id is 16 hex digits, not '" + dialer.id + "'"
                              : "";
        for (const auto& url : dialer.routes) {
          if (!bad.empty()) break;
          if (auto why = config::check_cluster_url(url, true))
            bad = "a route login announces '" + url + "', not a route URL: " + *why;
        }
        if (!bad.empty()) {
          connections_.close(c, CloseReason::kProtocolError, ErrorCode::kMalformedFrame,
                             bad + " (SPEC.md §8)");
          return false;
        }
        AuthResultCommand verdict = route_login(c, f.subject, dialer.id, user, secret);
        // A route in: its broker may be one this one does not know (gossip: dial back).
        if (verdict.identity && ctx_.core.routes != nullptr && !dialer.routes.empty())
          ctx_.core.routes->announced(dialer);
        on_auth_result(verdict);
        return c.is_up();
      }
      if (user.empty() && secret.empty()) {
        // No credentials: nothing slow to check, decided here. A verified
        // client certificate names its user (mutual TLS, docs/security.md).
        auto who = c.certificate_name.empty() ? ctx_.auth->verify({}, {})
                                              : ctx_.auth->verify_certificate(c.certificate_name);
        AuthResultCommand verdict{c.id, who ? who.value() : nullptr,
                                  who ? std::string() : who.error().message};
        on_auth_result(verdict);
      } else {
        ctx_.core.admission->awaiting_verdict(c.slot);
        ctx_.core.authenticator->submit({ctx_.index, c.id, std::string(host_of(c.peer)), std::string(user),
                                         std::string(secret), c.auth_deadline});
      }
      return c.is_up();
    }
    default:
      break;
  }
  // Only kAwaitingConnect gets here: process() holds what follows CONNECT.
  ctx_.stats.auth_failed.add();
  connections_.close(c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationRequired,
                     std::string(proto::to_string(f.header.type)) +
                         " before CONNECT: a connection's first frame must be CONNECT");
  return false;
}

namespace {
/// Compares a presented secret with the configured one in time that does not
/// depend on where they differ (OpenSSL's CRYPTO_memcmp); a length that
/// differs is told by the length alone.
bool same_secret(std::string_view presented, std::string_view expected) {
  return !expected.empty() && presented.size() == expected.size() &&
         CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}
}  // namespace

AuthResultCommand FrameHandler::route_login(Connection& c, std::string_view cluster, std::string_view server,
                                            std::string_view user, std::string_view secret) {
  // Routes are checked against cluster.user/password only, never against
  // auth.users: a client credential does not open a route, nor a route's a
  // client session (docs/cluster.md). Nothing slow: decided here.
  const auto& settings = ctx_.core.options.cluster;
  AuthResultCommand verdict{c.id, nullptr, {}};
  if (settings.name.empty()) {
    verdict.error = "route refused: this broker is not in a cluster (cluster.name is not set)";
  } else if (cluster != settings.name) {
    verdict.error = "route refused: cluster '" + std::string(cluster) + "' is not this broker's ('" +
                    settings.name + "')";
  } else if (!(same_secret(user, settings.user) & same_secret(secret, settings.password))) {
    verdict.error = "route refused: wrong route credentials";
  } else if (server == ctx_.core.server_id) {
    // Every broker may share one list that names itself (docs/cluster.md).
    verdict.error = "route refused: a route from this broker to itself";
    verdict.expected = true;
  } else if (!ctx_.core.route_peers.claim(std::string(server), c.id)) {
    verdict.error = "route refused: broker " + std::string(server) +
                    " already has a route here (is it listed twice in cluster.routes, under two names?)";
  } else {
    auto id = std::make_shared<Identity>();
    id->name = "route:" + std::string(server);
    id->route = true;
    id->route_server = std::string(server);
    id->permissions.publish.allow.clear();  // a route publishes nothing (SPEC.md §8)
    id->subscribe_unrestricted = true;
    verdict.identity = std::move(id);
  }
  return verdict;
}

void FrameHandler::hold_input(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end) {
  // The link reads nothing more until then: what is held stays bounded.
  if (c.held_input.empty()) c.link->pause();
  c.held_input.push_back({buf.clone(), begin, end});
}

void FrameHandler::take_held_input(Connection& c) {
  auto held = std::move(c.held_input);
  c.held_input.clear();
  for (auto& h : held) {
    if (!c.is_up()) break;
    // A held RDV_OFFER holds what follows it again, in order.
    if (c.rendezvous.open) {
      c.held_input.push_back(std::move(h));
      continue;
    }
    process(c, h.buf, h.begin, h.end);
  }
  if (c.is_up() && !c.input_held()) c.link->resume();
}

void FrameHandler::on_auth_result(AuthResultCommand& r) {
  Connection* c = connections_.find(r.connection_id);
  if (c == nullptr || c->state != ConnState::kVerifying) return;
  if (!r.identity && r.expected) {
    spdlog::info("connection {} from {}: {}", c->id, c->peer, r.error);
    connections_.close(*c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationFailed, r.error);
    return;
  }
  if (!r.identity) {
    ctx_.stats.auth_failed.add();
    // A guesser must not flood the journal: throttled, every one counted.
    log_throttled(ctx_.core.auth_failure_log, spdlog::level::warn,
                  "connection {} from {}: authentication failed: {}", c->id, c->peer, r.error);
    connections_.close(*c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationFailed, r.error);
    return;
  }
  c->identity = std::move(r.identity);
  // Whose pool share its queue counts against too: its user's, or for an
  // anonymous client its address's (a route: the broker it comes from).
  const Identity& who = *c->identity;
  c->tenant = ctx_.core.pool_shares.tenant(who.route       ? "route " + who.route_server
                                           : who.anonymous ? "address " + std::string(host_of(c->peer))
                                                           : "user " + who.name);
  c->state = ConnState::kOpen;
  ctx_.core.admission->authenticated(c->slot);
  c->link->on_authenticated();
  ctx_.stats.auth_ok.add();
  // Before the login's PONG: a client knows the cluster once connected.
  send_info(*c, ctx_.core.announced.get());
  spdlog::log(c->identity->anonymous ? spdlog::level::debug : spdlog::level::info,
              "connection {} from {} authenticated as {}", c->id, c->peer, c->identity->name);
  // What the client sent after CONNECT, taken now as if it had just arrived
  // (a PING among it is answered in its turn: the PONG means "authenticated").
  if (!c->held_input.empty()) take_held_input(*c);
}

bool FrameHandler::may_publish(Connection& c, std::string_view subject) {
  // The broker's own subjects: a client never publishes there, whatever its
  // permissions (a forged advisory would reach every $RB.> subscriber); a
  // route relays what another broker published.
  if (subject.starts_with(proto::kReservedPrefix)) return c.identity->route;
  if (c.identity->publish_unrestricted) return true;
  return c.publish_verdicts.get(subject, [&](std::string_view s) { return c.identity->may_publish(s); });
}

void FrameHandler::deny(Connection& c, std::string_view operation, std::string_view subject,
                        std::uint32_t sid) {
  (operation == "publish" ? ctx_.stats.denied_publish : ctx_.stats.denied_subscribe).add();
  // A client that keeps publishing where it may not would flood the log: the
  // first ten denials of a connection are logged, then every thousandth.
  if (++c.denials <= 10 || c.denials % 1000 == 0) {
    spdlog::warn("connection {} from {}: {} to '{}' denied for user '{}' ({} denials)", c.id, c.peer,
                 operation, subject, c.identity->name, c.denials);
  }
  const bool reserved = operation == "publish" && subject.starts_with(proto::kReservedPrefix);
  reply_error(c, ErrorCode::kPermissionDenied,
              std::string(operation) + " to '" + std::string(subject) + "' denied for user '" +
                  c.identity->name + "'" + (reserved ? ": $RB. subjects are the broker's own" : ""),
              sid);
}

void FrameHandler::apply_auth(std::shared_ptr<const AuthTable> table) {
  ctx_.auth = std::move(table);
  std::vector<Connection*> affected;
  connections_.for_each([&](Connection& c) {
    // A route's credentials are cluster.*, which a reload does not change.
    if (c.state == ConnState::kOpen && !c.dialed && !c.identity->route) affected.push_back(&c);
  });
  for (Connection* c : affected) {
    auto renewed = ctx_.auth->renew(*c->identity);
    if (!renewed) {
      spdlog::warn("connection {} from {}: access of '{}' revoked by a configuration reload", c->id, c->peer,
                   c->identity->name);
      connections_.close(*c, CloseReason::kAuthRevoked, ErrorCode::kAuthenticationFailed,
                         "access of '" + c->identity->name + "' revoked by a configuration reload");
      continue;
    }
    c->identity = std::move(renewed);
    c->publish_verdicts.clear();
    for (auto it = c->subscriptions.begin(); it != c->subscriptions.end();) {
      if (it->second.consumer) {
        if (renew_consumer(*c, it->first, it->second)) {
          ++it;
          continue;
        }
      } else if (c->identity->may_subscribe(it->second.pattern)) {
        ++it;
        continue;
      }
      const std::uint32_t sid = it->first;
      const std::string pattern = it->second.pattern;
      const bool consumer = it->second.consumer;
      drop_subscription(ctx_, *c, it->second, it->first);
      it = c->subscriptions.erase(it);
      ctx_.stats.subscriptions_revoked.add();
      spdlog::warn(
          "connection {} from {}: subscription {} to '{}' of user '{}' revoked by a configuration reload",
          c->id, c->peer, sid, pattern, c->identity->name);
      reply_error(*c, ErrorCode::kPermissionDenied,
                  consumer ? "consumer of stream '" + pattern.substr(kConsumerPatternPrefix.size()) +
                                 "' revoked: user '" + c->identity->name + "' may no longer read it"
                           : "subscription to '" + pattern + "' revoked: user '" + c->identity->name +
                                 "' may no longer subscribe to it",
                  sid);
    }
  }
}

bool FrameHandler::renew_consumer(Connection& c, std::uint32_t sid, const Connection::Subscription& sub) {
  const std::string_view stream = std::string_view(sub.pattern).substr(kConsumerPatternPrefix.size());
  if (!c.identity->may_read_stream(stream)) return false;
  // The engine checks the rest (a subject it may read, the durable's owner)
  // and passes every later delivery through the new permissions.
  ctx_.core.streams->command(consumer_command(ConsumerCommand::Kind::kRenew, c, sid));
  return true;
}

void FrameHandler::refuse_subscription(Connection& c, std::uint32_t sid, SubscriptionBudget::Refusal refusal,
                                       bool tenant) {
  const auto& opt = ctx_.options;
  const bool by_count = refusal == SubscriptionBudget::Refusal::kCount;
  std::string what;
  if (tenant) {
    (by_count ? ctx_.stats.limit_user_subscriptions : ctx_.stats.limit_user_subscription_memory).add();
    const std::uint32_t percent = opt.user_subscription_share_percent;
    const std::string whose = c.identity->anonymous
                                  ? "anonymous clients of address " + std::string(host_of(c.peer))
                                  : "user '" + c.identity->name + "'";
    what = by_count ? "subscription quota of " + whose + " reached: " +
                          std::to_string(SubscriptionBudget::part(opt.max_subscriptions_total, percent)) +
                          " subscriptions (limits.user_subscription_share_percent " +
                          std::to_string(percent) + "% of limits.max_subscriptions_total)"
                    : "subscription memory quota of " + whose + " reached: " +
                          std::to_string(SubscriptionBudget::part(opt.max_subscription_memory, percent)) +
                          " bytes (limits.user_subscription_share_percent " + std::to_string(percent) +
                          "% of limits.max_subscription_memory)";
  } else {
    (by_count ? ctx_.stats.limit_subscriptions_total : ctx_.stats.limit_subscription_memory).add();
    what = by_count
               ? "broker-wide limit of " + std::to_string(opt.max_subscriptions_total) +
                     " subscriptions reached (limits.max_subscriptions_total)"
               : "broker-wide subscription memory limit of " + std::to_string(opt.max_subscription_memory) +
                     " bytes reached (limits.max_subscription_memory)";
  }
  // Logged once per connection, like the per-connection limit.
  if (!std::exchange(c.subscription_limit_logged, true))
    spdlog::warn("connection {} from {}: {}", c.id, c.peer, what);
  reply_error(c, ErrorCode::kTooManySubscriptions, what, sid);
}

}  // namespace rdmabroker::daemon
