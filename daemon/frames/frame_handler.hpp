// SPDX-License-Identifier: Apache-2.0
// What a worker does with each frame a client sends: one handler per frame
// type, each gated by the connection's state (SPEC.md §2.4: CONNECT first)
// and its user's permissions (docs/security.md). Frames arrive whole, in
// order, from either link (an RDMA receive, or a TCP read's complete prefix).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "broker/subscription_budget.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "frames/route_frames.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "router/router.hpp"

namespace rdmabroker::daemon {

/// The authenticator's verdict on a connection's CONNECT.
struct AuthResultCommand {
  std::uint64_t connection_id = 0;
  std::shared_ptr<const Identity> identity;  // null: refused
  std::string error;                         // why, as the client is told
  /// A refusal that is part of normal operation (a broker's route to
  /// itself, SPEC.md §8): logged at info, not counted as a failed login.
  bool expected = false;
};

class FrameHandler {
 public:
  FrameHandler(WorkerContext& ctx, Connections& connections, Router& router)
      : ctx_(ctx), connections_(connections), router_(router), routes_(ctx, connections, router) {
    connections_.on_stall_end([this](Connection& c) { take_held_input(c); });
  }

  /// Handles the whole frames in [begin, end) of `buf` until the connection
  /// stops being up; an invalid frame closes it with the reason. A route
  /// this broker dialed is the client there: its frames go to routes().
  void process(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end);
  /// The routes this worker dialed (frames/route_frames.hpp).
  RouteFrames& routes() { return routes_; }
  /// Dialed route `c` is connected: it logs in there.
  void dialed_up(Connection& c) {
    routes_.watch(c);
    routes_.log_in(c);
  }

  /// The authenticator's verdict (frames/access.cpp).
  void on_auth_result(AuthResultCommand& r);
  /// Reload: renews every identity from the new table; revokes subscriptions
  /// and connections that lost their permission.
  void apply_auth(std::shared_ptr<const AuthTable> table);
  /// INFO with `text` to `c` if it speaks version 7 (SPEC.md §8, "Gossip");
  /// null `text`: nothing to announce.
  void send_info(Connection& c, const std::shared_ptr<const Announcement>& info);
  // frames/rendezvous.cpp (SPEC.md §3.8)
  /// Posts the next READs of c's open rendezvous, as far as its READs in
  /// flight, the pool and a stall allow.
  void read_more(Connection& c);
  /// A READ of c's rendezvous completed: its `count` pool buffers hold
  /// fragments, routed now; the next READs follow, or RDV_RELEASE.
  void on_read(Connection& c, std::array<BufferRef, kMaxFramesPerSend>& blocks, std::uint32_t count);

  /// The routes have every cluster interest entry up to `through` in effect:
  /// the PONGs held for it go out (SPEC.md §8, "Interest in effect").
  void release_pongs(std::uint32_t through);

 private:
  /// PONG now, or, in a cluster, once the interest of the connection's
  /// subscriptions is in effect at the other brokers.
  void answer_ping(Connection& c);
  /// Handles frame `f` of an open connection; false once the connection closed.
  bool on_frame(Connection& c, const proto::Frame& f, const BufferRef& buf);
  bool on_publish(Connection& c, const proto::Frame& f, const BufferRef& buf);
  /// A PUBLISH with the FRAGMENT flag (SPEC.md §3.7): checked against the
  /// connection's open message, then routed; false once the connection closed.
  bool on_fragment(Connection& c, const proto::Frame& f, const BufferRef& buf);
  /// RDV_OFFER (SPEC.md §3.8): checked, then its READs begin; false once the connection closed.
  bool on_offer(Connection& c, const proto::Frame& f);
  /// RDV_READY (SPEC.md §3.9): a subscriber's landing area for a message in
  /// progress to it; false once the connection closed.
  bool on_ready(Connection& c, const proto::Frame& f);
  /// RDV_RELEASE to the publisher of offer `offer`: `code` 0, read; else refused.
  void release_offer(Connection& c, std::uint64_t offer, proto::ErrorCode code);
  /// ABORT from the client: it abandons its open message.
  bool on_abort(Connection& c);
  /// Closes `c` for breaking a fragment rule; always false.
  bool fragment_violation(Connection& c, std::string why);
  /// Closes `c` with MALFORMED_FRAME saying `why`; always false.
  bool malformed(Connection& c, std::string why);
  /// Closes `c` with PAYLOAD_TOO_LARGE (counted as a limit refusal); always false.
  bool refuse_too_large(Connection& c, std::string why);
  void on_subscribe(Connection& c, const proto::Frame& f);
  void on_unsubscribe(Connection& c, const proto::Frame& f);
  /// MCAST_JOINED and MCAST_REPAIR; false if the connection was closed for it.
  bool on_multicast(Connection& c, const proto::Frame& f);

  // frames/consumer_frames.cpp (SPEC.md §3.11)
  /// CONSUME, ACK and FETCH: checked here, handed to the stream engine;
  /// false once the connection closed.
  bool on_consumer_frame(Connection& c, const proto::Frame& f);
  void on_consume(Connection& c, const proto::Frame& f);

  // frames/access.cpp
  /// A frame of a connection that is not authenticated yet; false if it closed.
  bool before_authentication(Connection& c, const proto::Frame& f);
  /// Keeps [begin, end) of buf, received after CONNECT (until the verdict)
  /// or after an RDV_OFFER (until its message is read).
  void hold_input(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end);
  /// Takes the held frames, in order, as if they had just arrived.
  void take_held_input(Connection& c);
  /// The verdict on a route's CONNECT (SPEC.md §8): its cluster's name, the
  /// dialing broker's id and the route credentials against cluster.*.
  AuthResultCommand route_login(Connection& c, std::string_view cluster, std::string_view server,
                                std::string_view user, std::string_view secret);
  bool may_publish(Connection& c, std::string_view subject);
  /// ERROR(PERMISSION_DENIED) to the client, a log line, a count.
  void deny(Connection& c, std::string_view operation, std::string_view subject, std::uint32_t sid);
  /// Charges a new subscription or consumer of `cost` to the connection's
  /// tenant (`tenant_charged`: whether it was) and to the broker-wide budget;
  /// false, and TOO_MANY_SUBSCRIPTIONS sent for `sid`, when either is spent.
  bool charge_subscription(Connection& c, std::uint32_t sid, std::uint64_t cost, bool& tenant_charged);
  /// A command about consumer `sid` of `c` for the stream engine, with who reads.
  ConsumerCommand consumer_command(ConsumerCommand::Kind kind, const Connection& c, std::uint32_t sid) const;
  /// Reload: consumer `sid` of `c` under its new identity; false if the
  /// user may no longer read its stream (the caller revokes it).
  bool renew_consumer(Connection& c, std::uint32_t sid, const Connection::Subscription& sub);
  /// TOO_MANY_SUBSCRIPTIONS for subscription `sid`: the tenant's quota
  /// (`tenant`) or the broker-wide budget is spent; the text names which.
  void refuse_subscription(Connection& c, std::uint32_t sid, SubscriptionBudget::Refusal refusal,
                           bool tenant);
  /// ERROR `code` about subscription `sid` (0: about none), the connection stays.
  void reply_error(Connection& c, proto::ErrorCode code, std::string text, std::uint32_t sid = 0);

  WorkerContext& ctx_;
  Connections& connections_;
  Router& router_;
  std::vector<std::uint64_t> pongs_held_;  // connections with held PONGs, in the order they began waiting
  RouteFrames routes_;
};

}  // namespace rdmabroker::daemon
