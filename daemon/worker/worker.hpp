// SPDX-License-Identifier: Apache-2.0
// A worker thread: the reactor. One event loop that owns its ports
// (connection/port.hpp: an RdmaPort per device, the TcpPort with its share
// of the listening sockets) and every connection handed to it
// (Connections). No other thread touches these; they reach the worker
// through its command queue.
//
// Loop order (run()): commands, CM events, the ports' polls (receive ->
// frames -> router -> subscriber queues; send -> retire), the batches for
// other workers, the flush of touched connections, the ports' periodic work,
// deadlines, reaping; then arm, poll once more, and sleep in epoll.
//
// The one exception to "only its thread": the worker's turn (turn_) is a
// mutex its thread holds except while it sleeps in epoll. Another thread with
// deliveries for a sleeping worker takes the turn and makes them itself, as
// the worker would on waking (deliver_if_asleep), instead of waking it
// through the command queue: the hand-off between workers costs no wake-up.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <variant>
#include <vector>

#include "broker/core.hpp"
#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "frames/frame_handler.hpp"
#include "rdma/device.hpp"
#include "rdma/rdma_dialer.hpp"
#include "rdma/rdma_link.hpp"
#include "rdma/rdma_port.hpp"
#include "router/router.hpp"
#include "tcp/tcp_port.hpp"
#include "tcp/tcp_listener.hpp"

#include "worker/command_queue.hpp"

namespace rdmabroker::daemon {

// ---------------------------------------------------------------- commands

/// Deliveries routed on another worker (or the multicast engine) to this worker's connections.
struct DeliverCommand {
  std::vector<RemoteDelivery> items;
};
/// An asynchronous QP error reported on the device's async event fd.
struct QpFatalCommand {
  std::uint64_t connection_id = 0;
  std::string event;
  /// IBV_EVENT_QP_LAST_WQE_REACHED: the QP left for the error state. News
  /// only for a connection that is open; closing ones cause it themselves.
  bool only_if_open = false;
};
/// IBV_EVENT_SRQ_LIMIT_REACHED on one of this worker's receive queues.
struct SrqLimitCommand {
  const ibv_srq* srq = nullptr;  // compared only: which port's queue
};
struct ShutdownCommand {};
/// Close this connection if it is still unauthenticated: the broker-wide
/// bound on unauthenticated connections made room for a newer one (Admission).
struct EvictCommand {
  std::uint64_t connection_id = 0;
};
/// A reload's settings: the worker takes the live ones (config::diff's
/// `live` keys) into its own copy; the others cannot have changed.
struct ReloadCommand {
  BrokerOptions options;
  std::shared_ptr<const AuthTable> auth;        // users and permissions now
  std::shared_ptr<std::promise<void>> applied;  // set once the worker uses them
};
/// One connection as `rdmabroker stat` shows it.
struct ConnectionInfo {
  std::uint64_t id = 0;
  std::string transport;
  std::uint32_t version = 0;  // the protocol version negotiated (SPEC.md §2.1)
  std::string peer;
  std::string state;
  std::string user;  // empty until authenticated
  std::uint32_t worker = 0;
  std::size_t subscriptions = 0;
  std::uint64_t messages_in = 0;
  std::uint64_t messages_out = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t pending_messages = 0;
  std::uint64_t pending_bytes = 0;
  std::uint32_t credits = 0;  // RDMA: the receive credits it holds (SPEC.md §5.1); TCP: 0
  std::string route_broker;   // another broker's route: that broker's id; empty for a client
};
/// Asks a worker for its connections; it answers through the promise.
struct ListConnectionsCommand {
  std::shared_ptr<std::promise<std::vector<ConnectionInfo>>> reply;
};
/// Test builds (fault.hpp): a fault aimed at one of this worker's connections.
struct FaultCommand {
  fault::Spec spec;
  std::shared_ptr<std::promise<Status>> reply;
};
/// What this broker announces changed (SPEC.md §8, "Gossip"): every open
/// connection of version 7 gets the new INFO.
struct InfoCommand {
  std::shared_ptr<const Announcement> info;
};
/// The routes have every cluster interest entry up to `through` in effect
/// (broker/cluster_interest.hpp): PONGs held for it go out.
struct InterestSyncedCommand {
  std::uint32_t through = 0;
};
/// Dial a route (broker/route_events.hpp): this worker owns its connection.
struct DialRouteCommand {
  RouteDial dial;
};
/// End route `route`'s connection, or its dial in progress (a reload removed it).
struct EndRouteCommand {
  std::uint64_t route = 0;
};
/// The cluster's interest changed: this worker's routes subscribe to it.
struct InterestChangedCommand {};
using Command = std::variant<AcceptCommand, DeliverCommand, QpFatalCommand, ShutdownCommand, ReloadCommand,
                             ListConnectionsCommand, AuthResultCommand, FaultCommand, EvictCommand,
                             InfoCommand, InterestSyncedCommand, SrqLimitCommand, DialRouteCommand,
                             EndRouteCommand, InterestChangedCommand>;

// ---------------------------------------------------------------- worker

class Worker {
 public:
  Worker(std::uint32_t index, BrokerCore& core);
  /// Joins the thread; then the members' reverse order is the teardown:
  /// connections (QPs, cm_ids, sockets) before ports (SRQ, MR, CQ, channel),
  /// ports before the CM channel and the send blocks' memory.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Creates the per-device resources (calling thread, before start()).
  /// `devices`: the RDMA devices served (null: TCP only). `tcp`: the
  /// broker's listening sockets, shared by all workers (EPOLLEXCLUSIVE wakes
  /// one), and the TLS context they serve with.
  Status init(const DeviceSet* devices, TcpListeners tcp);
  void start();
  void join();

  /// Any thread.
  void post(Command cmd) { commands_.post(std::move(cmd)); }
  /// Any thread but this worker's: makes `items` (deliveries to this
  /// worker's connections) on the calling thread if the worker sleeps and
  /// no command waits for it (which they would overtake); true if done. Else
  /// false, and the caller posts them as a DeliverCommand.
  bool deliver_if_asleep(std::vector<RemoteDelivery>& items);
  rdma_event_channel* cm_channel() const { return cm_channel_.get(); }
  std::uint32_t index() const { return ctx_.index; }
  const WorkerStats& stats() const { return ctx_.stats; }
  /// When the loop last went round (steady clock, ns): the watchdog's view of health.
  std::int64_t heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }

 private:
  // epoll user data: which fd woke us. The worker's own have a top byte of
  // zero; a port's carry its index there (connection/port.hpp, EpollTags).
  static constexpr std::uint64_t kTagCommands = 1;
  static constexpr std::uint64_t kTagCm = 2;

  void run();
  /// Waits up to timeout_ms (0: just looks) for any fd and handles what is
  /// ready: sockets at once, completion channels by re-enabling their polls.
  void wait_events(int timeout_ms);
  /// Counts one wake-up of a blocking wait that returned these events.
  void count_wakeup(const epoll_event* events, int n);
  bool poll_ports();
  /// Busy polling: spins on the ports until one has work (or a command or,
  /// with a port seen only by epoll, a socket waits) or `until`; true when
  /// it found some.
  bool spin_poll(std::chrono::steady_clock::time_point until);
  /// Whether a socket, a command or a CM event is ready (without waiting or
  /// taking it: the epoll set is level triggered); lets ports take events a
  /// spin has no use for (a completion channel's).
  bool sockets_ready();
  /// Whether any port says so.
  template <typename Pred>
  bool any_port(Pred pred) const {
    for (const auto& port : ports_)
      if (pred(*port)) return true;
    return false;
  }
  /// flow.adaptive_poll: spins for the window AdaptiveSpin chose, if a spin
  /// slot is free (BrokerCore::spin_slots); true when it found work.
  bool adaptive_spin();

  /// Queues deliveries for this worker's connections (they flush at the end of the turn).
  void deliver(std::vector<RemoteDelivery>& items);

  // Commands (worker/commands.cpp), one handler each.
  void handle_commands();
  void on_command(AcceptCommand& cmd);
  void on_command(DeliverCommand& cmd);
  void on_command(QpFatalCommand& cmd);
  void on_command(ShutdownCommand& cmd);
  void on_command(ReloadCommand& cmd);
  void on_command(ListConnectionsCommand& cmd);
  void on_command(AuthResultCommand& cmd) { frames_.on_auth_result(cmd); }
  /// Test builds: a fault aimed at a connection.
  void on_command(FaultCommand& cmd);
  void on_command(EvictCommand& cmd);
  void on_command(InfoCommand& cmd);
  void on_command(InterestSyncedCommand& cmd);
  void on_command(SrqLimitCommand& cmd);
  void on_command(DialRouteCommand& cmd);
  void on_command(EndRouteCommand& cmd);
  /// Taken once per loop turn however many came (check_routes).
  void on_command(InterestChangedCommand&) { interest_changed_ = true; }

  // Routes this worker dials (worker/routes.cpp).
  /// Dials `dial` now: a connection slot, then the transport its URL names.
  void dial_route(RouteDial dial);
  /// Once per loop turn: dials whose back-off ended, dial deadlines, the routes' PINGs.
  void check_routes();
  /// The TCP port, made when the first route is dialed over TCP on a broker without TCP listeners.
  TcpPort* tcp_port();

  void handle_cm_events();
  /// One CM event of a connection (copied out of the acked rdma_cm_event).
  void on_cm_event(rdma_cm_event_type type, int status, std::uint64_t conn_id);
  /// Test builds (fault cm-delay): CM events held back until due.
  void deliver_delayed_cm_events();

  WorkerContext ctx_;
  /// Held by the worker's thread while it runs, released while it sleeps in
  /// epoll: whoever holds it may use everything the worker owns.
  std::mutex turn_;
  std::unique_lock<std::mutex> turn_held_{turn_, std::defer_lock};  // the worker thread's hold
  bool asleep_ = false;  // guarded by turn_: released for epoll, not before start() or after run()
  std::atomic<std::int64_t> heartbeat_{0};
  SendBlocks blocks_;                  // registered by each port: outlives them
  verbs::EventChannelPtr cm_channel_;  // outlives the connections' cm_ids (null without RDMA)
  CommandQueue<Command> commands_;
  UniqueFd epoll_;
  /// Every port the loop drives: an RDMA port per device, the TCP port.
  std::vector<std::unique_ptr<Port>> ports_;
  /// The RDMA ports among them, for what only RDMA has: accepting a CM
  /// connect request on its device, an SRQ's limit event.
  std::vector<RdmaPort*> rdma_ports_;
  bool epoll_only_ports_ = false;  // a port is seen only through epoll (TCP): a spin looks there too
  Connections
      connections_;  // after ports_: every QP goes before its CQ and SRQ, every socket before its port
  Router router_;
  FrameHandler frames_;
  /// Dials of routes over RDMA (after ports_ and connections_: its QPs go first).
  std::unique_ptr<RdmaDialer> dialer_;
  TcpPort* tcp_port_ = nullptr;           // in ports_, if any
  std::vector<RouteDial> waiting_dials_;  // routes to dial once their back-off ends
  bool interest_changed_ = false;         // an InterestChangedCommand came this turn

  std::chrono::steady_clock::time_point last_work_{};          // the last loop turn that found completions
  AdaptiveSpin adaptive_;                                      // flow.adaptive_poll's window
  std::chrono::steady_clock::time_point next_socket_check_{};  // busy loop: when to look at sockets
  std::vector<Command> command_scratch_;
  /// RDMA connections evicted before their AcceptCommand arrived (the
  /// listener posts it after Admission may already have chosen to evict it):
  /// refused when it does. Bounded: a connection that ended meanwhile never
  /// arrives, and its id would stay.
  std::unordered_set<std::uint64_t> evicted_before_accept_;
  bool stopping_ = false;
  struct DelayedCmEvent {
    std::chrono::steady_clock::time_point due;
    rdma_cm_event_type type;
    int status;
    std::uint64_t conn_id;
  };
  std::vector<DelayedCmEvent> delayed_cm_;  // test builds: fault cm-delay
  std::thread thread_;
};

}  // namespace rdmabroker::daemon
