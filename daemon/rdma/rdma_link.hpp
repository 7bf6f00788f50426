// SPDX-License-Identifier: Apache-2.0
// A connection's RDMA transport: its cm_id and RC QP on a worker's port (the
// port's CQ and SRQ), the credit window both ways (SPEC.md §5), and the flush
// that chains a connection's sends into one ibv_post_send with only the last
// one signaled.
#pragma once

#include <rdma/rdma_cma.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "connection/connection.hpp"
#include "connection/connections.hpp"
#include "rdma/rdma_port.hpp"
#include "rdmabroker/common/credits.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace rdmabroker::daemon {

/// A connect request the listener validated; the owning worker creates the
/// QP and accepts. The cm_id is the command's until then (destroyed with a
/// command that is never handled).
struct AcceptCommand {
  verbs::CmIdPtr id;
  proto::ConnectRequest request;
  std::uint64_t connection_id = 0;
  std::uint32_t slot = 0;
  std::string peer;
  bool route_listener = false;  // came in on cluster.listen_rdma
};

/// Refuses a connect request with `reason` (SPEC.md §2: the reject's private
/// data names it, and the buffer size the broker needs).
void reject_connect_request(rdma_cm_id* id, proto::RejectReason reason, std::uint32_t buffer_size);

/// Moves a QP of our own on cm_id `id` through `states` with the attributes
/// rdma_cm derives for it, as rdma_accept (or rdma_connect) does for a QP of
/// its own, except that it allows no remote access (the protocol uses SEND
/// only, SPEC.md §1.1) and, with `clamp_rnr`, keeps the RNR retry count at
/// most RdmaLink::kMaxRnrRetry; `read_depth`: the RDMA READs it may have
/// outstanding as the initiator (a rendezvous, SPEC.md §3.8; the peer's
/// memory, never ours). Returns the count rdma_cm gave, or the failed step.
Result<std::uint8_t> move_qp(rdma_cm_id* id, ibv_qp* qp, std::initializer_list<ibv_qp_state> states,
                             bool clamp_rnr, std::uint8_t read_depth = 0);

class RdmaLink final : public Link {
 public:
  /// Credits granted at accept, before the client has authenticated: its
  /// CONNECT and one more frame (SPEC.md §5). A flood of connections that
  /// never authenticate then claims little of the SRQ's credit budget; the
  /// rest of flow.credits comes once the client has authenticated.
  static constexpr std::uint32_t kUnauthenticatedCredits = 2;
  /// The most RNR retries the broker's QP makes before a SEND to a client
  /// that posted no receive fails (SPEC.md §5): the client's connect request
  /// asks for a count (7: for ever), and a client that grants credits it has
  /// no receives for must not hold the broker's sends for longer than this.
  static constexpr std::uint8_t kMaxRnrRetry = 3;

  /// Creates the QP for `cmd` on `port` and accepts the connection; on any
  /// failure rejects it (logged, counted, slot released) and returns null.
  static std::unique_ptr<Connection> accept(AcceptCommand& cmd, RdmaPort& port, WorkerContext& ctx,
                                            Connections& connections, bool stopping);
  /// The link of a route this broker dialed (rdma/rdma_dialer.hpp), its QP
  /// in RTS on `port`: it gave its broker `grant` credits in its connect
  /// request (claimed on the port already) and got `peer_credits` in the
  /// accept.
  static std::unique_ptr<RdmaLink> dialed(RdmaPort& port, WorkerContext& ctx, Connections& connections,
                                          verbs::CmIdPtr id, verbs::QpPtr qp, std::uint32_t max_inline,
                                          std::uint32_t grant, std::uint32_t peer_credits);
  /// An RC QP for connection `connection_id` on `port`'s CQs and SRQ, in
  /// RESET; `max_inline`: the inline data the device gave.
  static Result<verbs::QpPtr> create_qp(RdmaPort& port, std::uint64_t connection_id, std::uint32_t window,
                                        std::uint32_t& max_inline);
  ~RdmaLink() override;

  Transport transport() const override { return Transport::kRdma; }
  void flush() override;
  /// A stalled publisher's credits are withheld (take_credits_to_return).
  void pause() override {}
  /// The end of a stall: an offer being read goes on (read_later).
  void resume() override;
  std::uint32_t read_width() const override;
  bool read_remote(std::uint64_t address, std::uint32_t rkey, std::span<const Segment> pieces,
                   std::array<BufferRef, kMaxFramesPerSend>& blocks) override;
  void read_later() override;
  void add_send_credits(std::uint32_t n) override { credits.add_send_credits(n); }
  /// Grows the pre-authentication grant (kUnauthenticatedCredits) to
  /// flow.credits; a version-3 connection grows by demand instead.
  void on_authenticated() override;
  std::uint32_t receive_window() const override { return credits.window(); }
  /// Its last credit is the one a peer keeps for credit updates (CreditWindow::kReserve).
  bool input_paused() const override { return credits.outstanding() <= CreditWindow::kReserve; }
  /// Moves the QP to the error state: posted sends complete as flushed.
  void disconnect() override;
  void release() override;
  std::string where() const override;
  const sockaddr* multicast_address(std::uint32_t& device) const override;

  /// A receive's immediate value (0 without one): credits returned and, in
  /// version 3, credits given back. A SEND with frames (`data`) counts as
  /// activity, one that starts with a PUBLISH (`publishes`) may grow the
  /// window (SPEC.md §5.1). False if the client gave back more than it held.
  bool on_credit_imm(std::uint32_t imm, bool data, bool publishes);
  /// Asks an authenticated version-3 connection without data for
  /// RdmaPort::kIdleReclaim to give back all but RdmaPort::kMinWindow
  /// credits (once per that period); true if it must be flushed to ask.
  bool reclaim_if_idle(const Connection& c, std::chrono::steady_clock::time_point now);
  bool by_demand() const { return by_demand_; }
  std::chrono::steady_clock::time_point last_data() const { return last_data_; }
  /// Whether the QP is in the error state (ibv_query_qp). A peer can put it
  /// there (an RDMA WRITE with a made-up rkey: the broker's QPs allow no
  /// remote access) without the device raising an async event (rxe does
  /// not), and an idle connection posts nothing that would fail.
  bool qp_in_error() const;

  /// Test builds (fault qp-error, wc-error): the QP to the error state.
  bool force_error();
  Status inject_fault(fault::Kind kind) override;
  RdmaPort& port() const { return port_; }

  CreditWindow credits;
  bool fail_next_wc = false;  // test builds: fault wc-error armed on this link

 private:
  /// The credits a new connection on `port` starts with (2 or more), with
  /// a refill if the budget is short, and room for its send `window` on the
  /// send CQ; why not (counted), if there is none.
  /// The accept's rendezvous_min for a connection of `version` (0: no
  /// rendezvous), and the READs its QP may have outstanding then.
  static std::uint32_t rendezvous_min_for(std::uint8_t version, const BrokerOptions& opt,
                                          const RdmaPort& port);
  static std::uint8_t read_depth_on(const RdmaPort& port);
  /// rdma_accept with the accept's private data (SPEC.md §2.2); false if it failed (errno).
  static bool send_accept(rdma_cm_id* id, const Connection& conn, std::uint32_t grant, std::uint32_t qp_num,
                          std::uint8_t read_depth, const BrokerOptions& opt);
  static Result<std::uint32_t> claim_credits(RdmaPort& port, WorkerContext& ctx, Connections& connections,
                                             std::uint32_t window);
  RdmaLink(RdmaPort& port, WorkerContext& ctx, Connections& connections, verbs::CmIdPtr id, verbs::QpPtr qp,
           std::uint32_t max_inline);
  /// The immediate value of the next SEND: credits owed to the client that
  /// may go back now (none while stalled) and, in version 3, a pending ask.
  std::uint32_t take_imm(const Connection& c);
  /// Sets what this link counts in the port's windows_total (and the gauge).
  void charge(std::uint32_t amount);
  /// Charges the window as it is now.
  void sync_charge();
  void stage_send(Connection& c, std::uint32_t block, const Segment* sge, std::uint32_t num_sge,
                  std::uint32_t imm, std::array<BufferRef, kMaxFramesPerSend>* refs,
                  const PackedSend& packed);
  /// Stages one RDMA WRITE of the fragments at the front of c's queue into
  /// their landing area (SPEC.md §3.9), if they go there (kTaken); or says
  /// that the front waits for the client's RDV_READY.
  Connections::LandingRun stage_write(Connection& c);
  /// Posts the staged sends as one chain, the last one signaled; on failure
  /// undoes what was not posted and closes the connection.
  void post_staged(Connection& c);

  RdmaPort& port_;
  WorkerContext& ctx_;
  Connections& connections_;
  verbs::CmIdPtr cm_id_;  // declared before the QP: destroyed after it
  verbs::QpPtr qp_;       // ours, not rdma_cm's (ready_qp): disconnect() puts it in error
  std::uint32_t qp_num_ = 0;
  std::uint32_t max_inline_ = 0;  // bytes a SEND may carry inline (the QP's cap)
  bool by_demand_ = false;        // version 3: credits by demand (SPEC.md §5.1)
  bool dialed_ = false;           // a route this broker dialed: the client's side of §5
  bool split_imm_ = true;         // immediates carry returned and release (version 3 on)
  std::uint8_t read_depth_ = 0;   // READs the QP may have outstanding (version 8, rendezvous on)
  std::uint32_t charged_ = 0;     // what this link counts in port_.windows_total: its window
  std::chrono::steady_clock::time_point last_data_{};
  std::uint32_t release_ask_ = 0;  // credits to ask back in the next SEND's immediate value
  std::chrono::steady_clock::time_point asked_at_{};  // the last ask (none pending: {})
};

}  // namespace rdmabroker::daemon
