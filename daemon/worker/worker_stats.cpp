// SPDX-License-Identifier: Apache-2.0
// The declaration of every statistic a worker keeps (see broker/stats.hpp):
// the snapshot key, and the Prometheus family, help and label it is exported
// as. Names are part of the operators' interface (dashboards, alerts,
// docs/operations.md): change them on purpose only.
#include "broker/stats.hpp"
#include "tcp/tcp_port.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

namespace {

// Families with more than one series, declared once each.
constexpr std::string_view kClosed = "rdmabroker_connections_closed_total";
constexpr std::string_view kClosedHelp = "Connections closed, by close reason.";
constexpr std::string_view kDropped = "rdmabroker_messages_dropped_total";
constexpr std::string_view kDroppedHelp = "Routed messages not delivered, by the policy that dropped them.";
constexpr std::string_view kAuth = "rdmabroker_authentications_total";
constexpr std::string_view kAuthHelp = "Connections that presented credentials, by outcome.";
constexpr std::string_view kDenied = "rdmabroker_permission_denied_total";
constexpr std::string_view kDeniedHelp = "Publishes and subscriptions refused by the user's permissions.";
constexpr std::string_view kPoolHeld = "rdmabroker_pool_buffers_held";
constexpr std::string_view kPoolHeldHelp =
    "Pool buffers held, by holder: posted on the receive queues, or queued for subscribers (out-queues).";

}  // namespace

void WorkerStats::visit(StatsVisitor& v) const {
  // A series of a labelled family: key = prefix + label value.
  const auto labelled = [&v](std::string_view prefix, std::string_view value, const Counter& c,
                             std::string_view metric, std::string_view help, std::string_view label) {
    v.counter({std::string(prefix) + std::string(value), metric, help, label, std::string(value)}, c.get());
  };
  const auto histogram = [&v](std::string key, const auto& h, std::string_view metric,
                              std::string_view help) {
    HistogramSnapshot s;
    s.add(h);
    v.histogram({std::move(key), metric, help}, s);
  };

  // Connections.
  v.count("connections.accepted", connections_accepted, "rdmabroker_connections_accepted_total",
          "Connections that completed their handshake.");
  v.level("connections.current", connections_current.get());
  const std::int64_t tcp = tcp_connections.get();
  v.gauge({"connections.by_transport.tcp", "rdmabroker_connections", "Open client connections, by transport.",
           "transport", "tcp"},
          tcp);
  v.gauge({"connections.by_transport.rdma", "rdmabroker_connections",
           "Open client connections, by transport.", "transport", "rdma"},
          connections_current.get() - tcp);
  for (std::size_t r = 0; r < kCloseReasonCount; ++r) {
    labelled("connections.closed.", to_string(static_cast<CloseReason>(r)), connections_closed[r], kClosed,
             kClosedHelp, "reason");
  }
  v.counter({"", "rdmabroker_slow_consumers_total", "Subscribers disconnected as slow consumers."},
            connections_closed[static_cast<std::size_t>(CloseReason::kSlowConsumer)].get());
  v.count("connections.accept_failures", accept_failures);

  // Messages.
  v.count("messages.in", messages_in, "rdmabroker_messages_received_total",
          "PUBLISH frames accepted from clients.");
  v.count("bytes.in", bytes_in, "rdmabroker_received_bytes_total",
          "Payload bytes of accepted PUBLISH frames.");
  v.count("messages.no_subscribers", messages_no_subscribers, "rdmabroker_messages_no_subscribers_total",
          "Messages published to a subject nobody subscribes to.");
  v.count("messages.no_responders", no_responders, "rdmabroker_requests_no_responders_total",
          "Requests answered with NO_RESPONDERS.");
  v.count("messages.headers_stripped", headers_stripped, "rdmabroker_messages_headers_stripped_total",
          "Messages delivered without their headers to clients of protocol version 1, which cannot read "
          "them.");
  v.count("messages.routed", routed, "rdmabroker_messages_routed_total",
          "Copies of messages queued for subscribers (fan-out).");
  v.count("messages.delivered", deliveries, "rdmabroker_messages_delivered_total",
          "Messages sent to subscribers (send completed).");
  v.count("bytes.out", bytes_out, "rdmabroker_delivered_bytes_total", "Payload bytes of delivered messages.");
  v.count(
      "cluster.route_messages_out", route_deliveries, "rdmabroker_route_messages_sent_total",
      "Messages sent to other brokers' routes (published here, wanted there; in messages.delivered too).");
  v.count("cluster.route_bytes_out", route_bytes_out, "rdmabroker_route_sent_bytes_total",
          "Payload bytes of the messages sent to other brokers' routes.");
  for (std::size_t r = 0; r < kDropReasonCount; ++r) {
    labelled("messages.dropped.", to_string(static_cast<DropReason>(r)), dropped[r], kDropped, kDroppedHelp,
             "reason");
  }
  v.level("messages.pending", pending_messages.get(), "rdmabroker_messages_pending",
          "Messages queued for subscribers and not yet sent.");
  v.level("messages.pending_bytes", pending_bytes.get(), "rdmabroker_pending_bytes",
          "Frame bytes queued for subscribers, all connections.");
  // Summed over the workers, what WorkerSet::pending_charge_total() compares
  // with the bound (one worker's part may be below zero: what it took from
  // another that the other counted out).
  v.level("messages.pending_charge",
          queued_charge(pending_bytes.get(), pending_messages.get()) +
              static_cast<std::int64_t>(transit_charge_out.get()) -
              static_cast<std::int64_t>(transit_charge_in.get()),
          "rdmabroker_pending_charged_bytes",
          "Queued frame bytes plus 128 bytes of bookkeeping per queued message, with the deliveries on "
          "their way between workers: what limits.max_pending_bytes_total bounds.");
  v.gauge({"pool.held.out_queues", kPoolHeld, kPoolHeldHelp, "holder", "out_queues"}, queue_pins.get());
  v.gauge({"", kPoolHeld, kPoolHeldHelp, "holder", "receive_queues"}, srq_posted.get());
  v.count("messages.compacted", compacted_messages, "rdmabroker_messages_compacted_total",
          "Messages waiting for a subscriber copied out of the receive buffers they arrived in, into a "
          "buffer of the subscriber's own, so that those return to the pool.");
  for (std::size_t s = 0; s < kShareScopeCount; ++s) {
    labelled("slow_consumers.pool_share.", to_string(static_cast<ShareScope>(s)), share_cuts[s],
             "rdmabroker_pool_share_cuts_total",
             "Subscribers cut as slow consumers for holding more of the buffer pool than a share: their "
             "connection's, their user's, or their part of the broker's queue budget.",
             "share");
  }
  v.count("protocol_errors", protocol_errors, "rdmabroker_protocol_errors_total",
          "Connections closed for a protocol error.");
  v.count("producer_stalls", producer_stalls, "rdmabroker_producer_stalls_total",
          "Publishers slowed because a subscriber they feed was backlogged.");

  // RDMA.
  v.count("rdma.sends_posted", sends_posted, "rdmabroker_rdma_sends_total",
          "RDMA SEND work requests posted.");
  v.count("rdma.frames_sent", frames_sent);
  v.count("rdma.credit_updates", credit_updates, "rdmabroker_credit_updates_total",
          "Zero-byte SENDs that only returned credits.");
  v.count("rdma.credit_stalls", credit_stalls, "rdmabroker_credit_stalls_total",
          "Flushes that had data for an RDMA client but no send credit.");
  v.count("rdma.receives", receives, "rdmabroker_rdma_receives_total", "RDMA receive completions.");
  v.count("rdma.orphan_receives", orphan_receives, "rdmabroker_rdma_orphan_receives_total",
          "Receives for a QP that was already gone.");
  v.count("rdma.wc_errors", wc_errors, "rdmabroker_rdma_work_completion_errors_total",
          "Work completions with an error status (other than flush).");
  v.count("rdma.rendezvous.offers", rendezvous_offers, "rdmabroker_rendezvous_offers_total",
          "Large messages offered by rendezvous (SPEC.md §3.8) and read from their publishers' memory.");
  v.count("rdma.rendezvous.reads", rendezvous_reads, "rdmabroker_rendezvous_reads_total",
          "RDMA READ work requests posted to take offered messages.");
  v.count("rdma.rendezvous.bytes", rendezvous_bytes, "rdmabroker_rendezvous_bytes_total",
          "Bytes of offered messages read by RDMA READ.");
  v.count("rdma.rendezvous.read_errors", rendezvous_read_errors, "rdmabroker_rendezvous_read_errors_total",
          "READs of an offered message that failed (its region was not readable or the publisher vanished); "
          "each closed its publisher's connection.");
  v.count("rdma.landing.areas", landing_areas, "rdmabroker_landing_areas_total",
          "Landing areas subscribers named for large messages (SPEC.md §3.9), written by RDMA WRITE.");
  v.count("rdma.landing.writes", landing_writes, "rdmabroker_landing_writes_total",
          "RDMA WRITE work requests posted into subscribers' landing areas.");
  v.count("rdma.landing.bytes", landing_bytes, "rdmabroker_landing_bytes_total",
          "Bytes of large messages written into subscribers' landing areas.");
  v.count("rdma.landing.write_errors", landing_write_errors, "rdmabroker_landing_write_errors_total",
          "WRITEs into a landing area that failed (the area was not writable or the subscriber vanished); "
          "each closed its subscriber's connection.");
  v.count("rdma.credit_reclaims", credit_reclaims, "rdmabroker_credit_reclaims_total",
          "Idle RDMA connections asked to give receive credits back (credits by demand).");
  v.count("rdma.credit_refusals", credit_refusals, "rdmabroker_credit_refusals_total",
          "RDMA connections refused because the credit windows already filled their port's receive queue.");
  v.count("rdma.srq_refills", srq_refills, "rdmabroker_srq_refills_total",
          "Shared receive queue refills at the low watermark.");
  v.count("rdma.srq_limit_events", srq_limit_events, "rdmabroker_srq_limit_events_total",
          "Times a device reported a shared receive queue down to less than a refill batch "
          "(IBV_EVENT_SRQ_LIMIT_REACHED): the worker fell behind its senders or the pool ran short.");
  v.level("rdma.srq_posted", srq_posted.get(), "rdmabroker_srq_posted_receives",
          "Receives posted on the shared receive queues.");
  v.level("rdma.credits_granted", credits_granted.get(), "rdmabroker_credits_granted",
          "Receive credits held by RDMA clients (their windows); never above what the queues may hold.");
  v.level(
      "rdma.credit_capacity", credit_capacity.get(), "rdmabroker_credit_capacity",
      "Receive credits the shared receive queues may hold for RDMA clients (the bound of credits granted).");
  v.count("rdma.cq_full", cq_full, "rdmabroker_cq_full_refusals_total",
          "RDMA connections refused because their completion queue had no room.");
  v.count("pool.exhausted", pool_exhausted, "rdmabroker_pool_exhausted_total",
          "Times a worker found the buffer pool empty (once per shortage).");
  histogram("completions_per_poll", completions_per_poll, "rdmabroker_completions_per_poll",
            "Work completions returned by one ibv_poll_cq call that found any.");
  histogram("relay_latency_seconds", relay_latency, "rdmabroker_relay_latency_seconds",
            "Time from a message's arrival at the broker to the completion of the send carrying it to a "
            "subscriber.");

  // TCP.
  v.level("tcp.connections", tcp);
  v.count("tcp.reads", tcp_reads, "rdmabroker_tcp_reads_total",
          "read() calls on TCP connections that returned data.");
  v.count("tcp.writes", tcp_writes, "rdmabroker_tcp_writes_total",
          "sendmsg() calls on TCP connections that wrote data.");
  v.count("tcp.write_blocked", tcp_write_blocked, "rdmabroker_tcp_write_blocked_total",
          "TCP writes that found the socket buffer full.");
  v.level("tls.connections", tls_connections.get(), "rdmabroker_tls_connections",
          "Open TLS connections (also counted as TCP connections).");
  v.count("tls.handshakes", tls_handshakes, "rdmabroker_tls_handshakes_total", "TLS handshakes completed.");
  static_assert(std::tuple_size_v<decltype(tls_failures)> == kTlsFailureCount);
  for (std::size_t f = 0; f < kTlsFailureCount; ++f) {
    labelled("tls.handshake_failures.", to_string(static_cast<TlsFailure>(f)), tls_failures[f],
             "rdmabroker_tls_handshake_failures_total", "TLS handshakes that failed, by reason.", "reason");
  }
  v.count("tls.plain_refused", tls_plain_refused, "rdmabroker_tls_plain_refused_total",
          "Plain TCP clients refused because tls.mode is required.");

  // Limits, authentication, permissions.
  const auto limit = [&](std::string_view name, const Counter& c) {
    v.counter(kLimitRefusals.series("limits.refused." + std::string(name), std::string(name)), c.get());
  };
  limit("payload", limit_payload);
  limit("subscriptions", limit_subscriptions);
  limit("subscriptions_total", limit_subscriptions_total);
  limit("consumer_opens", limit_consumer_opens);
  limit("subscription_memory", limit_subscription_memory);
  limit("user_subscriptions", limit_user_subscriptions);
  limit("user_subscription_memory", limit_user_subscription_memory);
  limit("pending_total", limit_pending_total);
  labelled("auth.", "ok", auth_ok, kAuth, kAuthHelp, "outcome");
  labelled("auth.", "failed", auth_failed, kAuth, kAuthHelp, "outcome");
  labelled("permissions.denied.", "publish", denied_publish, kDenied, kDeniedHelp, "operation");
  labelled("permissions.denied.", "subscribe", denied_subscribe, kDenied, kDeniedHelp, "operation");
  v.count("permissions.revoked", subscriptions_revoked, "rdmabroker_subscriptions_revoked_total",
          "Subscriptions removed because a reload took the permission away.");

  // Wake-ups: a worker that spins (flow.busy_poll_us) finds work without one.
  for (std::size_t c = 0; c < kWakeCauseCount; ++c) {
    labelled("wakeups.", to_string(static_cast<WakeCause>(c)), wakeups[c], "rdmabroker_worker_wakeups_total",
             "Times a worker's blocking wait returned, by what ended it (the first of its events).", "cause");
  }
  constexpr std::string_view kSpins = "rdmabroker_worker_spins_total";
  constexpr std::string_view kSpinsHelp =
      "Spins on the completion queues before sleeping (flow.busy_poll_us, flow.adaptive_poll): found work "
      "(a wake-up saved) or ran out (a core spent for nothing).";
  labelled("spins.", "found", spins_found, kSpins, kSpinsHelp, "outcome");
  labelled("spins.", "empty", spins_empty, kSpins, kSpinsHelp, "outcome");
  constexpr std::string_view kHandoffs = "rdmabroker_worker_handoffs_total";
  constexpr std::string_view kHandoffsHelp =
      "Batches of deliveries another thread had for this worker's connections: made by that thread while "
      "this worker slept (direct), or queued for it (queued).";
  labelled("handoffs.", "direct", handoffs_direct, kHandoffs, kHandoffsHelp, "how");
  labelled("handoffs.", "queued", handoffs_queued, kHandoffs, kHandoffsHelp, "how");
}

}  // namespace rdmabroker::daemon
