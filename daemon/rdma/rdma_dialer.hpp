// SPDX-License-Identifier: Apache-2.0
// The RDMA side of a route this broker dials (broker/route_events.hpp): the
// active half of rdma_cm, on the worker's CM channel and one of its ports.
// Address, then route resolution; then a QP of our own on the port's CQs
// and SRQ, INIT, and rdma_connect with the connect request (SPEC.md §2.1);
// the broker's answer comes as CONNECT_RESPONSE (a QP not made by rdma_cm),
// after which the QP goes to RTR and RTS and rdma_establish completes the
// connection: only then does a Connection exist, with an RdmaLink, and log
// in. A failure at any step, or no answer within kDialTimeout, releases
// what the dial held and tells the routes. Worker thread only.
#pragma once

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/route_events.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "frames/frame_handler.hpp"
#include "rdma/rdma_port.hpp"
#include "rdmabroker/common/url.hpp"
#include "rdmabroker/common/verbs.hpp"

namespace rdmabroker::daemon {

class RdmaDialer {
 public:
  /// How long a dial may take, resolution to the broker's answer.
  static constexpr std::chrono::seconds kDialTimeout{10};

  RdmaDialer(WorkerContext& ctx, Connections& connections, FrameHandler& frames, rdma_event_channel* channel,
             std::vector<RdmaPort*> ports)
      : ctx_(ctx), connections_(connections), frames_(frames), channel_(channel), ports_(std::move(ports)) {}
  /// QPs before their cm_ids: the members' order.
  ~RdmaDialer() = default;

  /// Dials `url` as connection `id` (its connection slot taken) for `dial`.
  void dial(std::uint64_t id, std::uint32_t slot, const ParsedUrl& url, RouteDial dial);
  /// A CM event: true if it was one of a dial in progress (handled, acked).
  bool on_cm_event(rdma_cm_event* ev);
  /// Dials past kDialTimeout fail.
  void check_deadlines();
  /// The dial of route `route` in progress, if any, ends (the route was removed).
  void cancel(std::uint64_t route);
  /// Every dial in progress ends (shutdown).
  void cancel_all();

 private:
  struct Pending {
    std::uint64_t id = 0;
    std::uint32_t slot = 0;
    std::string peer;  // host:port
    RouteDial dial;
    verbs::CmIdPtr cm_id;  // before the QP: destroyed after it
    verbs::QpPtr qp;
    RdmaPort* port = nullptr;
    std::uint32_t max_inline = 0;
    std::uint32_t grant = 0;  // credits given in the connect request (claimed on the port)
    std::chrono::steady_clock::time_point deadline{};
  };
  using Map = std::unordered_map<std::uint64_t, Pending>;

  /// ROUTE_RESOLVED: the QP, its credits, rdma_connect; why not, if not.
  Status connect(Pending& p);
  /// CONNECT_RESPONSE with the broker's accept: RTR, RTS, rdma_establish, the Connection.
  Status establish(Map::iterator it, std::span<const std::byte> accept_data);
  /// Ends a dial that failed: its credits and slot back, the routes told.
  void fail(Map::iterator it, const std::string& why);
  /// Ends a dial this broker gave up (credits and slot back); the next entry.
  Map::iterator drop(Map::iterator it);

  WorkerContext& ctx_;
  Connections& connections_;
  FrameHandler& frames_;
  rdma_event_channel* channel_;
  std::vector<RdmaPort*> ports_;
  Map pending_;  // by connection id (the cm_id's context)
};

}  // namespace rdmabroker::daemon
