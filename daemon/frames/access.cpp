// Authentication and permissions on a worker (docs/security.md): the CONNECT
// a connection must send first, the authenticator's verdict, the checks on
// PUBLISH and SUBSCRIBE, and what a reload changes for connected clients.
#include <spdlog/spdlog.h>

#include "worker/worker.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

bool Worker::before_authentication(Connection& c, const proto::Frame& f) {
  switch (f.header.type) {
    case FrameType::kConnect: {
      if (c.auth != AuthPhase::kAwaitingConnect) break;
      const auto* p = reinterpret_cast<const char*>(f.payload.data());
      const std::string_view user(p, f.header.arg);
      const std::string_view secret(p + f.header.arg, f.payload.size() - f.header.arg);
      c.auth = AuthPhase::kVerifying;
      if (user.empty() && secret.empty()) {
        // No credentials: nothing slow to check, decided here.
        auto anonymous = auth_->verify({}, {});
        AuthResultCommand verdict{c.id, anonymous ? anonymous.value() : nullptr,
                                  anonymous ? std::string() : anonymous.error().message};
        on_auth_result(verdict);
      } else {
        core_.authenticator->submit({index_, c.id, std::string(user), std::string(secret)});
      }
      return c.state == ConnState::kEstablished;
    }
    case FrameType::kPing:
      if (c.auth != AuthPhase::kVerifying) break;
      ++c.deferred_pongs;  // answered after the verdict: a client's PONG means "authenticated"
      return true;
    case FrameType::kCredit:
      if (c.transport == Transport::kRdma) c.credits.add_send_credits(f.header.arg);
      return true;
    case FrameType::kClose:
      c.close_received = true;
      close(c, CloseReason::kClientClose);
      return false;
    default:
      break;
  }
  stats_.auth_failed.add();
  close(c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationRequired,
        std::string(proto::to_string(f.header.type)) +
            (c.auth == AuthPhase::kAwaitingConnect
                 ? " before CONNECT: a connection's first frame must be CONNECT"
                 : " while the credentials are being checked"));
  return false;
}

void Worker::on_auth_result(AuthResultCommand& r) {
  Connection* c = find(r.connection_id);
  if (c == nullptr || c->state != ConnState::kEstablished || c->auth != AuthPhase::kVerifying) return;
  if (!r.identity) {
    stats_.auth_failed.add();
    spdlog::warn("connection {} from {}: authentication failed: {}", c->id, c->peer, r.error);
    close(*c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationFailed, r.error);
    return;
  }
  c->identity = std::move(r.identity);
  c->auth = AuthPhase::kDone;
  stats_.auth_ok.add();
  spdlog::log(c->identity->anonymous ? spdlog::level::debug : spdlog::level::info,
              "connection {} from {} authenticated as {}", c->id, c->peer, c->identity->name);
  for (; c->deferred_pongs > 0; --c->deferred_pongs) enqueue(*c, make_control(FrameType::kPong, 0));
}

void Worker::check_auth_deadlines() {
  std::erase_if(unauthenticated_, [&](std::uint64_t id) {
    Connection* c = find(id);
    if (c == nullptr || c->state != ConnState::kEstablished || c->auth == AuthPhase::kDone) return true;
    if (now_ < c->auth_deadline) return false;
    stats_.auth_failed.add();
    close(*c, CloseReason::kAuthFailed, ErrorCode::kAuthenticationRequired,
          "not authenticated within " + std::to_string(kAuthTimeout.count()) + " s of connecting");
    return true;
  });
}

bool Worker::may_publish(Connection& c, std::string_view subject) {
  if (c.identity->publish_unrestricted) return true;
  if (auto it = c.publish_verdicts.find(subject); it != c.publish_verdicts.end()) return it->second;
  if (c.publish_verdicts.size() >= 1024)
    c.publish_verdicts.clear();  // bounded: a client may use any number of subjects
  const bool ok = c.identity->may_publish(subject);
  c.publish_verdicts.emplace(std::string(subject), ok);
  return ok;
}

void Worker::deny(Connection& c, std::string_view operation, std::string_view subject, std::uint32_t sid) {
  (operation == "publish" ? stats_.denied_publish : stats_.denied_subscribe).add();
  // A client that keeps publishing where it may not would flood the log: the
  // first ten denials of a connection are logged, then every thousandth.
  if (++c.denials <= 10 || c.denials % 1000 == 0) {
    spdlog::warn("connection {} from {}: {} to '{}' denied for user '{}' ({} denials)", c.id, c.peer,
                 operation, subject, c.identity->name, c.denials);
  }
  enqueue(c, make_control(FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kPermissionDenied),
                          std::string(operation) + " to '" + std::string(subject) + "' denied for user '" +
                              c.identity->name + "'",
                          sid));
}

void Worker::apply_auth(std::shared_ptr<const AuthTable> table) {
  auth_ = std::move(table);
  std::vector<Connection*> affected;
  for (auto& [id, c] : connections_) {
    if (c->state == ConnState::kEstablished && c->auth == AuthPhase::kDone) affected.push_back(c.get());
  }
  for (Connection* c : affected) {
    auto renewed = auth_->renew(*c->identity);
    if (!renewed) {
      spdlog::warn("connection {} from {}: access of '{}' revoked by a configuration reload", c->id, c->peer,
                   c->identity->name);
      close(*c, CloseReason::kAuthRevoked, ErrorCode::kAuthenticationFailed,
            "access of '" + c->identity->name + "' revoked by a configuration reload");
      continue;
    }
    c->identity = std::move(renewed);
    c->publish_verdicts.clear();
    for (auto it = c->subscriptions.begin(); it != c->subscriptions.end();) {
      if (c->identity->may_subscribe(it->second.pattern)) {
        ++it;
        continue;
      }
      const std::uint32_t sid = it->first;
      const std::string pattern = it->second.pattern;
      drop_subscription(*c, it->second, it->first);
      it = c->subscriptions.erase(it);
      stats_.subscriptions_revoked.add();
      spdlog::warn(
          "connection {} from {}: subscription {} to '{}' of user '{}' revoked by a configuration reload",
          c->id, c->peer, sid, pattern, c->identity->name);
      enqueue(*c, make_control(FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kPermissionDenied),
                               "subscription to '" + pattern + "' revoked: user '" + c->identity->name +
                                   "' may no longer subscribe to it",
                               sid));
    }
  }
}

}  // namespace rdmabroker::daemon
