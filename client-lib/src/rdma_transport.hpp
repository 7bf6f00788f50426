// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: the RDMA transport of a Session
// (rdma_transport.cpp; its multicast side in rdma_multicast.cpp).
//
// One RC QP per client with its own CQ and receive queue. Frames are encoded
// straight into registered send buffers: the buffer being filled is posted at
// once when the connection is idle, and otherwise keeps collecting frames
// until a send completes (coalescing; SPEC.md "Batching"). Credits follow the
// same rules as the broker (common/credits.hpp).
#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client_internal.hpp"
#include "rdmabroker/common/adaptive_spin.hpp"
#include "rdmabroker/common/credits.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/ud_endpoint.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "transport.hpp"

namespace rdmabroker {

constexpr std::uint64_t kRecvFlag = 1ull << 63;
/// Multicast receive buffers: the GRH plus the largest datagram (4096-byte MTU).
constexpr std::uint32_t kUdRecvs = 512;
constexpr std::uint32_t kUdBufferSize = proto::kGrhSize + 4096;

class RdmaTransport final : public Transport {
 public:
  RdmaTransport(SessionSide& session, ParsedUrl url) : Transport(session), url_(std::move(url)) {}
  ~RdmaTransport() override { close(); }

  Status connect() override;
  void close() override;

  std::uint64_t groups_joined() const override { return groups_joined_.load(std::memory_order_relaxed); }

 private:
  /// One attempt: resolve, create the QP and buffers, exchange the
  /// handshake, start the session's side (reject: the broker's refusal).
  Status connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject);
  Status resolve(const std::string& where, Clock::time_point deadline);
  /// PD, CQ, QP and the posted receive buffers on the device the route chose.
  Status create_resources(std::uint32_t recv_buffer_size);
  Result<proto::ConnectAccept> exchange_handshake(std::uint32_t recv_buffer_size, const std::string& where,
                                                  Clock::time_point deadline, proto::ConnectReject* reject);
  /// Send buffers, credits, the I/O thread's epoll set, the description.
  Status start_session(const proto::ConnectAccept& accept, const std::string& where);
  Result<rdma_cm_event_type> wait_cm_event(rdma_cm_event_type expected, Clock::time_point deadline,
                                           std::vector<std::byte>* private_data);
  void teardown_resources();
  /// The I/O thread (none for a polled client): progress() until close().
  void run();
  std::size_t progress(int timeout_ms) override;
  void progress_sends() override;
  /// progress()'s: takes every receive completion there is; true if any.
  bool poll_receives();
  /// run()'s steps. Busy polling: spins on the CQ until `until`; true if it
  /// found completions (handled).
  bool spin_on_cq(Clock::time_point until, Deliveries& deliveries, std::vector<Error>& errors);
  /// ClientOptions::adaptive_poll: spins for the window AdaptiveSpin chose,
  /// if one of the process's spin slots is free; true if it found completions.
  bool adaptive_spin();
  /// Waits up to timeout_ms (-1: forever) for the fds; acknowledges CQ events
  /// and handles group events; true if the connection's CM channel is ready.
  bool wait_for_events(int timeout_ms);
  void handle_cm_events(std::vector<Error>& errors);

  void transmit_locked() override;
  bool transmits_every_turn() const override { return io_thread_.joinable(); }
  bool drained_locked() const override { return inflight_.empty(); }
  Result<proto::RendezvousRegion> expose_for_read(std::uint64_t offer, std::unique_ptr<std::byte[]> data,
                                                  std::size_t length) override;
  void release_region(std::uint64_t offer) override;
  std::optional<std::uint32_t> expose_for_write(std::uint32_t sid, std::uint64_t publisher, std::byte* data,
                                                std::size_t length) override;
  void release_landing(std::uint32_t sid, std::uint64_t publisher) override;
  void reclaim_locked() override;
  /// Posts one SEND: `buffer` (kNoBuffer: none, a credit update) with `len` bytes.
  bool post_locked(std::uint32_t buffer, std::uint32_t len);
  /// Takes the send CQ's completions (any thread, with the session's lock):
  /// their SENDs leave the window and their buffers are free. True if any.
  bool reap_sends_locked();
  /// Arms the send CQ when a thread waits on a send (send_events_wanted_locked).
  void arm_sends_if_waited_locked();
  /// An application thread's publish that comes sooner after its last post
  /// than that post took (a Soft-RoCE post is a system call that sends the
  /// packet): the I/O thread is woken to post it, with whatever gathers
  /// until it runs, as one SEND (docs/architecture.md, "Batching").
  bool hand_off_locked();
  /// Posts what is ready, as the window and the send slots allow.
  void post_ready_locked();
  bool send_events_wanted_locked() const;
  /// A receive completion (the I/O thread; sends complete in send_cq_). Its
  /// buffer is held (held_) until the deliveries have been dispatched.
  void on_completion(const ibv_wc& wc, Deliveries& deliveries, std::vector<Error>& errors);
  /// I/O thread, after dispatch(), with the session's lock: posts the held
  /// receive buffers again (their credits are then owed to the broker).
  void repost_held_locked();
  /// The receive buffer a receive's wr_id names.
  std::byte* recv_buf(std::uint64_t wr_id) const {
    return recv_mem_.get() + std::size_t{static_cast<std::uint32_t>(wr_id & ~kRecvFlag)} * recv_buffer_size_;
  }

  // Multicast (SPEC.md §7): one UD QP, on the connection's device, joined to
  // the groups of the subscriptions the broker serves by multicast.
  void join_group(std::uint32_t sid, const proto::McastJoin& j, std::uint64_t epoch) override;
  void leave_group(std::uint32_t sid) override;
  /// Creates the UD endpoint on first use; false with `why` if it cannot.
  bool open_ud(std::string& why);
  void post_ud_receive(std::uint32_t index);
  void handle_group_events();
  void drain_ud(Deliveries& deliveries);
  void teardown_ud();
  struct Group {
    sockaddr_in addr{};
    bool joined = false;
    std::set<std::uint32_t> sids;                                  // subscriptions it serves
    std::vector<std::pair<std::uint32_t, std::uint64_t>> waiting;  // (sid, epoch) to answer once joined
  };
  std::map<std::uint32_t, Group> groups_;                      // by channel; I/O thread
  std::unordered_map<std::uint32_t, std::uint32_t> group_of_;  // sid -> channel

  const ParsedUrl url_;

  // Verbs resources in creation order; teardown_resources() undoes them in reverse.
  verbs::EventChannelPtr cm_channel_;
  verbs::CmIdPtr id_;
  verbs::PdPtr pd_;
  verbs::CompChannelPtr comp_channel_;
  // Two CQs on one completion channel. Receives: armed always, each arrival
  // wakes the I/O thread. Sends: polled by whichever thread holds the
  // session's lock next and armed only while a thread waits on a SEND
  // (send_events_wanted_locked), so a publish at light load wakes nobody.
  verbs::CqPtr cq_;
  verbs::CqEventAcker acker_;
  verbs::CqPtr send_cq_;
  verbs::CqEventAcker send_acker_;
  verbs::CmQp qp_;
  std::uint32_t max_inline_ = 0;                 // bytes a SEND may carry inline (what the device granted)
  std::uint32_t recv_buffer_size_ = 0;           // each receive buffer's (the handshake's)
  std::uint8_t protocol_version_ = 0;            // the accept's
  std::atomic<std::uint64_t> groups_joined_{0};  // multicast groups joined now (stats, any thread)
  std::unique_ptr<std::byte[]> recv_mem_;
  verbs::MrPtr recv_mr_;
  verbs::MrPtr send_mr_;  // registers the session's send buffers
  /// Messages offered by rendezvous (SPEC.md §3.8), each registered for
  /// remote READ on its own until the broker releases it: the broker sees
  /// only the message in flight, never the rest of our memory. Guarded by
  /// the session's lock; deregistered before the PD goes.
  struct ExposedRegion {
    std::unique_ptr<std::byte[]> data;
    verbs::MrPtr mr;  // after data: deregistered before it is freed
  };
  std::unordered_map<std::uint64_t, ExposedRegion> exposed_;
  /// Landing areas (SPEC.md §3.9) by (sid, publisher), each the memory of
  /// one large message the broker may WRITE into until it is whole; the
  /// memory is the message's (the session's reassembly), these only its
  /// registrations. I/O thread; deregistered before the PD goes.
  std::map<std::pair<std::uint32_t, std::uint64_t>, verbs::MrPtr> landings_;
  // Receives completed and decoded, not posted again yet: messages delivered
  // in place (MessageView) point into them until dispatch() has run. I/O thread.
  std::vector<std::uint64_t> held_;
  // The loop's state between turns (whoever runs progress()).
  Deliveries deliveries_;
  std::vector<Error> errors_;
  Clock::time_point last_work_ = Clock::now();
  AdaptiveSpin adaptive_;          // adaptive_poll's window
  bool recv_cq_armed_ = false;     // an event is requested for the next receive completion
  std::uint32_t quick_turns_ = 0;  // turns that did not sleep (the fds are looked at every 16th)
  // UD endpoint (created on the first MCAST_JOIN), in creation order.
  verbs::EventChannelPtr ud_cm_channel_;   // outlives the endpoint's id
  std::unique_ptr<verbs::UdEndpoint> ud_;  // receive slots of kUdBufferSize
  bool ud_failed_ = false;
  /// Test builds: RDMABROKER_TEST_FAIL_MCAST_JOIN set when connecting makes
  /// every join fail, as on a fabric that refuses it (read once, on the
  /// connecting thread: the I/O thread never calls getenv).
  bool fail_joins_ = false;
  std::string ud_error_;
  UniqueFd epoll_;
  std::thread io_thread_;

  /// Version 3: the immediate values carry asks and give-backs (SPEC.md §5.1).
  bool by_demand() const { return protocol_version_ >= proto::kCreditsByDemandVersion; }

  // Guarded by the session's lock.
  CreditWindow credits_;
  /// A SEND posted and not yet known to be complete; `buffer` is kNoBuffer
  /// for a credit update and for an inline send (its bytes were copied at post).
  struct Posted {
    std::uint64_t wr = 0;  // its wr_id: posts are numbered in order
    std::uint32_t buffer = SessionSide::kNoBuffer;
  };
  std::deque<Posted> inflight_;  // oldest first, as an RC send queue completes them
  /// What the last post from an application thread cost, and when it
  /// ended: a publish that comes sooner after it than that is handed to the
  /// I/O thread (hand_off_locked).
  Clock::duration last_post_cost_{};
  Clock::time_point last_post_end_{};
  bool handed_off_ = false;  // the I/O thread was woken to post what is ready
  Clock::time_point handed_off_at_{};
  std::uint64_t next_wr_ = 0;
  bool send_cq_armed_ = false;
  /// A failed SEND that a thread other than the I/O thread reaped: the I/O
  /// thread reports it (on_error) at its next turn.
  std::vector<Error> send_errors_;
};

}  // namespace rdmabroker
