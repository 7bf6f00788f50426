// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: everything a client does above its transport.
//
// A Session is the client's protocol engine, written once for both
// transports, and made of parts that each own one job:
//
//   SendBuffers       (send_buffers.hpp)      the buffers frames are encoded into, and batching
//   SubscriptionTable (subscriptions.hpp)     subscriptions, their callbacks and queues
//   PendingRequests   (requests.hpp)          request/reply over a per-connection inbox
//   Reassembler       (reassembly.hpp)        messages larger than a frame, from fragments
//   SequencedStreams  (multicast_streams.hpp) multicast: in order, once, gaps repaired
//
// The session itself holds what ties them together: the connection's state
// (established, closing, closed and why), the login, PING/PONG flushes, the
// frame decoder for what the broker sends (session_receive.cpp), the turns
// of a polled client's loop (session_turns.cpp) and the multicast control
// frames (session_multicast.cpp). It owns its Transport (transport.hpp),
// which sees it only as a SessionSide.
//
// Locking: mu_ guards the session's state and the parts marked so; callbacks
// run on the I/O thread without it. The I/O loop's own parts (Reassembler,
// SequencedStreams) need no lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "multicast_streams.hpp"
#include "reassembly.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/consumer.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "rdmabroker/proto/info.hpp"
#include "requests.hpp"
#include "send_buffers.hpp"
#include "subscriptions.hpp"
#include "transport.hpp"

namespace rdmabroker {

static_assert(SendBuffers::kNone == SessionSide::kNoBuffer);

class Session;
/// What a Consumer holds of its session: the session may go first.
class SessionAnchor {
 public:
  explicit SessionAnchor(Session* s) : session_(s) {}
  /// Runs f(session) unless the session is gone (then kClosed).
  template <typename F>
  auto with(F f) -> decltype(f(std::declval<Session&>())) {
    std::lock_guard lock(mu_);
    if (session_ == nullptr) return Error{ErrorKind::kClosed, "the client is closed"};
    return f(*session_);
  }
  void detach() {
    std::lock_guard lock(mu_);
    session_ = nullptr;
  }

 private:
  std::mutex mu_;
  Session* session_;
};

class Session final : public Client, private SessionSide, private LandingHost {
 public:
  explicit Session(ClientOptions options) : opt_(std::move(options)) {}
  /// Closes the transport first: its I/O thread uses the session.
  ~Session() override {
    close();
    anchor_->detach();
  }

  /// Connects to `url` (rdma://, tcp:// or tls://) over the transport its
  /// scheme names.
  Status connect(const ParsedUrl& url);
  /// Polled: with the loop's turn held, so that no poll() runs meanwhile.
  void close() override;

  Status publish(std::string_view subject, ByteView payload) override;
  Status publish_request(std::string_view subject, std::string_view reply, ByteView payload) override;
  Result<Message> request(std::string_view subject, ByteView payload,
                          std::chrono::milliseconds timeout) override;
  Status publish(std::string_view subject, const Headers& headers, ByteView payload,
                 std::string_view reply) override;
  Result<Message> request(std::string_view subject, const Headers& headers, ByteView payload,
                          std::chrono::milliseconds timeout) override;
  using Client::publish;
  using Client::request;
  Result<std::uint32_t> subscribe(std::string_view subject, MessageHandler handler) override;
  Result<std::shared_ptr<Subscription>> subscribe(std::string_view subject) override;
  Result<std::uint32_t> queue_subscribe(std::string_view subject, std::string_view group,
                                        MessageHandler handler) override;
  Result<std::shared_ptr<Subscription>> queue_subscribe(std::string_view subject,
                                                        std::string_view group) override;
  Result<std::uint32_t> subscribe_view(std::string_view subject, MessageViewHandler handler) override {
    return queue_subscribe_view(subject, {}, std::move(handler));
  }
  Result<std::uint32_t> queue_subscribe_view(std::string_view subject, std::string_view group,
                                             MessageViewHandler handler) override;
  Status unsubscribe(std::uint32_t sid) override;
  Status flush(std::chrono::milliseconds timeout) override;
  Result<std::size_t> poll(std::chrono::microseconds timeout) override;
  Status wake() override;
  Result<PubAck> publish_acked(std::string_view subject, const Headers& headers, ByteView payload,
                               std::chrono::milliseconds timeout) override;
  using Client::publish_acked;
  Status publish_acked_async(std::string_view subject, const Headers& headers, ByteView payload,
                             PubAckHandler done) override;
  Result<std::shared_ptr<Consumer>> consume(std::string_view stream, const ConsumerOptions& options,
                                            std::chrono::milliseconds timeout) override;
  /// ACK, FETCH (session_consumers.cpp): a consumer's frame to the broker.
  Status send_consumer_frame(proto::FrameType type, std::uint32_t sid, std::uint64_t sequence,
                             std::uint16_t flags = 0, ByteView payload = {});
  std::size_t max_payload(std::size_t subject_len) const override {
    // Version 4: the broker's limit, in fragments beyond one frame (SPEC.md §3.7).
    if (protocol_version_ >= proto::kFragmentsVersion && max_message_ != 0) return max_message_;
    return frame_room(subject_len, 0);
  }
  std::string transport_description() const override {
    std::lock_guard lock(mu_);
    return description_;
  }
  /// The broker's frame limit (its receive buffer size).
  std::uint32_t max_frame() const { return sends_.frame_size(); }
  /// For ReconnectingClient: subscribes with a given id (the application's,
  /// kept across connections), delivering to `handler` or into `queue`, a
  /// queue that outlives this session (its failure does not close it).
  Result<std::uint32_t> restore_subscription(std::uint32_t sid, std::string_view subject,
                                             std::string_view group, MessageViewHandler handler,
                                             std::shared_ptr<QueueSubscription> queue);
  /// Whether `sid` is still subscribed (not unsubscribed, refused or revoked).
  bool has_subscription(std::uint32_t sid) const {
    std::lock_guard lock(mu_);
    return subs_.contains(sid);
  }
  Error close_reason() const override {
    std::lock_guard lock(mu_);
    return closed_ ? close_error_ : Error{ErrorKind::kClosed, ""};
  }
  ClientStats stats() const override;
  ServerInfo server_info() const override {
    std::lock_guard lock(mu_);
    return server_info_;
  }

 private:
  // ------------------------------------------------ SessionSide: what the transport sees
  const ClientOptions& options() const override { return opt_; }
  std::unique_lock<std::mutex> lock() override { return std::unique_lock(mu_); }
  Status connect_with_retry(const std::function<Status(std::uint32_t, proto::ConnectReject*)>& attempt,
                            const std::function<void()>& reset) override;
  void init_send_buffers(const proto::ConnectAccept& accept, std::uint32_t count) override;
  std::span<std::byte> send_memory() override { return sends_.memory(); }
  void established(std::string description) override;
  Status authenticate() override;
  bool begin_close() override;
  void ended() override;
  bool stop_requested() const override {
    std::lock_guard lock(mu_);
    return stop_;
  }
  bool closed_locked() const override { return closed_; }
  bool closing_locked() const override { return closing_; }
  void fail_locked(Error why) override;
  std::pair<std::uint32_t, std::uint32_t> take_ready_locked() override { return sends_.take_ready(); }
  bool has_ready_locked() const override { return sends_.has_ready(); }
  bool out_of_buffers_locked() const override { return !sends_.has_free(); }
  void release_send_buffer_locked(std::uint32_t buffer) override {
    sends_.release(buffer);
    cv_.notify_all();
  }
  std::byte* send_buffer(std::uint32_t buffer) override { return sends_.buffer(buffer); }
  void sends_completed_locked() override { cv_.notify_all(); }
  void on_frames(std::span<const std::byte> data, Deliveries& deliveries,
                 std::vector<Error>& errors) override;
  std::size_t dispatch(Deliveries& deliveries, std::vector<Error>& errors) override;
  void on_datagram(std::span<const std::byte> datagram, Deliveries& deliveries) override;
  void join_done(std::uint32_t sid, std::uint64_t epoch, const std::string& error) override;
  int check_gaps() override;

  // ------------------------------------------------ waiting and the polled loop
  /// Waits (mu_ held) until pred() or the deadline; false on timeout. A
  /// thread of a threaded client sleeps on cv_; one of a polled client makes
  /// progress meanwhile (progress()).
  template <typename Pred>
  bool wait_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Pred pred) {
    if (!opt_.polled) return wait_counted(cv_, lock, deadline, *app_wakeups_, pred);
    while (!pred()) {
      const auto now = Clock::now();
      if (now >= deadline) return pred();
      lock.unlock();
      progress_until(deadline);
      lock.lock();
    }
    return true;
  }
  /// Polled: one turn of the transport's loop from this thread, waiting no
  /// later than `deadline` (at most 100 ms: another thread may be the one
  /// that makes the progress waited for). From a callback of this client,
  /// whose thread is in a turn already, only the sends progress.
  std::size_t progress_until(Clock::time_point deadline);
  /// Polled: how a queue subscription's next() drives this client.
  Driver driver() {
    if (!opt_.polled) return nullptr;
    return [this](Clock::time_point deadline) { progress_until(deadline); };
  }
  enum class Turn { kPoll, kWait };
  /// One turn of the loop (polled): waits up to timeout_ms.
  std::size_t progress(int timeout_ms, Turn turn = Turn::kWait);
  /// progress_mu_, for a wait inside the library or close(): a poll()
  /// holding it is woken rather than waited out.
  std::unique_lock<std::mutex> take_turn();

  // ------------------------------------------------ sending
  Status check_open_locked() const {
    if (closed_) return close_error_;
    return {};
  }
  /// What one PUBLISH frame with this subject and reply can carry.
  std::size_t frame_room(std::size_t subject_len, std::size_t reply_len) const {
    return proto::max_payload(proto::max_publish_frame(sends_.frame_size()), subject_len, reply_len);
  }
  /// Encodes a frame into the open send buffer, waiting (up to publish_timeout)
  /// for one if all are taken; `sequence` != 0 is kept as the frame's
  /// sequence; `wait` false: fails at once instead (the I/O thread must not wait
  /// for buffers that only it can free).
  Status append_frame_locked(std::unique_lock<std::mutex>& lock, const proto::FrameHeader& h,
                             std::string_view subject, std::string_view reply, ByteView payload,
                             std::uint64_t sequence = 0, bool wait = true,
                             std::span<const proto::HeaderField> headers = {});
  Status publish_locked(std::unique_lock<std::mutex>& lock, std::string_view subject, std::string_view reply,
                        ByteView payload, std::uint16_t flags,
                        std::span<const proto::HeaderField> headers = {});
  /// Offers a message of rendezvous_min_ or more for the broker to READ
  /// (SPEC.md §3.8): copied into a region registered for it alone.
  Status publish_rendezvous_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                   std::string_view reply, ByteView payload, std::uint16_t flags,
                                   std::span<const proto::HeaderField> headers);
  /// Sends a message larger than a frame as fragments, back to back (other
  /// publishes wait meanwhile); one that fails half-way is abandoned with
  /// ABORT before the next publish.
  Status publish_fragments_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                  std::string_view reply, ByteView payload, std::uint16_t flags,
                                  std::span<const proto::HeaderField> headers);
  /// PING, and wait for its PONG until `deadline`.
  Status flush_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);

  // ------------------------------------------------ requests and subscriptions
  /// The request() of both forms: `headers` already checked.
  /// A PUB_ACK: the answer publish_acked() waits for.
  void on_pub_ack(const proto::Frame& f);
  // session_consumers.cpp (SPEC.md §3.11)
  void on_consumer_ready(const proto::Frame& f);
  /// FETCH_DONE: a mark in the consumer's queue, behind the messages before it.
  void on_fetch_done(const proto::Frame& f, Deliveries& deliveries);
  /// An ERROR about a consumer that has not opened yet: consume() returns
  /// it (true); false when `sid` is no such consumer.
  bool on_consumer_refused(std::uint32_t sid, proto::ErrorCode code, const std::string& msg);
  Result<Message> request_with(std::string_view subject, std::span<const proto::HeaderField> headers,
                               ByteView payload, std::chrono::milliseconds timeout);
  /// Makes the inbox at the first request, and waits (until `deadline`)
  /// for the broker's PONG after its SUBSCRIBE: in a cluster that PONG says
  /// the other brokers have its interest too, so a reply from any of them
  /// finds its way back (SPEC.md §8, "Interest in effect").
  Status ensure_inbox_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  void on_inbox_message(const MessageView& m);
  /// `made`: where the queue of a queue subscription (no handler) is stored,
  /// before its SUBSCRIBE leaves, so that a refusal arriving at once closes
  /// the queue the caller gets instead of racing it.
  Result<std::uint32_t> add_subscription(std::string_view subject, std::string_view group,
                                         MessageViewHandler handler,
                                         std::shared_ptr<QueueSubscription>* made = nullptr);
  /// Registers a subscription (a queue when `handler` is empty) and sends its SUBSCRIBE.
  Result<std::uint32_t> subscribe_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                         std::string_view group, MessageViewHandler handler,
                                         std::uint32_t sid = 0,
                                         std::shared_ptr<QueueSubscription> queue = nullptr,
                                         std::shared_ptr<QueueSubscription>* made = nullptr);
  /// The broker refused or revoked subscription `sid`: a blocking reader's
  /// next() returns kClosed with `why`, a callback gets nothing more.
  void end_subscription(std::uint32_t sid, const std::string& why);

  // ------------------------------------------------ receiving (I/O loop)
  /// A DELIVER's messages into `deliveries` (a sequenced one through its
  /// stream); false if it was malformed (the session then failed).
  bool on_deliver(const proto::Frame& f, Deliveries& deliveries, std::vector<Error>& errors);
  /// A multicast control frame from the broker (MCAST_JOIN, _LEAVE, _LOSS).
  void on_multicast_frame(const proto::Frame& f, Deliveries& deliveries, std::vector<Error>& errors);
  /// INFO (SPEC.md §8, "Gossip"): kept for server_info(), passed to
  /// on_server_info. False (the session failed) when it breaks the rules.
  bool on_info(const proto::Frame& f, std::vector<Error>& errors);
  /// ERROR or CLOSE from the broker: reported, and what it ends (a
  /// subscription, the authentication, the session) ends.
  void on_error_frame(const proto::Frame& f, std::vector<Error>& errors);
  /// I/O thread: sends a multicast control frame now, or at the next
  /// check_gaps() if every send buffer is taken.
  void send_from_io(std::uint32_t sid, proto::FrameType type, std::uint64_t sequence,
                    std::vector<std::byte> payload);
  /// I/O thread: the frames send_from_io() had to keep, in their order.
  void send_deferred();
  // LandingHost (SPEC.md §3.9): the transport registers, RDV_READY goes out.
  std::optional<std::uint32_t> expose_for_write(std::uint32_t sid, std::uint64_t publisher, std::byte* data,
                                                std::size_t length) override;
  void release_landing(std::uint32_t sid, std::uint64_t publisher) override;
  void send_ready(std::uint32_t sid, std::uint64_t sequence, const proto::LandingArea& area) override;

  // ------------------------------------------------ state
  const ClientOptions opt_;
  std::unique_ptr<Transport> transport_;  // null until connect()

  // The broker's answer in the accept (set while connecting, read-only after).
  std::uint8_t protocol_version_ = proto::kVersion;
  std::uint32_t recv_buffer_size_ = 0;  // ours: largest frame the broker sends us
  std::uint32_t max_message_ = 0;       // version 4: the broker's limits.max_payload (0: one frame)
  std::uint64_t connection_id_ = 0;     // the accept's: a fragment's sequence (SPEC.md §3.7)
  std::uint32_t rendezvous_min_ = 0;    // version 8, RDMA: messages this large go by rendezvous (§3.8)

  mutable std::mutex mu_;
  std::condition_variable cv_;  // send buffer freed, PONG or reply received, closed
  // ---- guarded by mu_
  std::string description_;
  bool established_ = false;
  bool closed_ = false;
  bool stop_ = false;
  bool closing_ = false;  // close() has begun: a disconnect is ours, not an error
  Error close_error_{ErrorKind::kClosed, ""};
  ServerInfo server_info_;  // the last INFO (SPEC.md §8, "Gossip")
  SendBuffers sends_;
  SubscriptionTable subs_;
  PendingRequests requests_;
  /// Acknowledged publishes waiting for their PUB_ACK (SPEC.md §3.10), by id.
  struct AckWait {
    bool done = false;
    proto::ErrorCode code = proto::ErrorCode::kNone;
    PubAck ack;
    std::string subject;    // for its error's text
    PubAckHandler handler;  // publish_acked_async's; none: a publish_acked() waits for it
  };
  /// Registers and sends a PUBLISH with ACK; its id.
  Result<std::uint64_t> send_acked_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                          const Headers& headers, ByteView payload, PubAckHandler handler);
  /// Once closed: the asynchronous publishes that will get no answer get kClosed.
  void fail_unanswered_acks();
  std::map<std::uint64_t, AckWait> acks_;
  std::uint64_t next_ack_ = 1;
  /// publish_acked_async's unanswered, at most kMaxAsyncAcks.
  static constexpr std::size_t kMaxAsyncAcks = 512;
  /// From this many unanswered, new frames wait for the next answer (append_frame_locked).
  static constexpr std::size_t kCorkAfterAsyncAcks = 64;
  std::size_t async_acks_ = 0;
  /// Consumers waiting for CONSUMER_READY or their refusal, by sid.
  struct ConsumerWait {
    bool ready = false;
    std::uint64_t pending = 0;
    std::optional<Error> refused;
  };
  std::map<std::uint32_t, ConsumerWait> consumer_waits_;
  /// How consumers reach this session, and learn that it is gone.
  std::shared_ptr<SessionAnchor> anchor_ = std::make_shared<SessionAnchor>(this);
  bool fragmenting_ = false;    // a publish is sending fragments: other publishes wait
  bool abort_pending_ = false;  // a fragmented publish failed half-way: ABORT goes first
  /// Rendezvous (SPEC.md §3.8): offers the broker has not released yet, by
  /// id with their length. A publish waits while kMaxOffers are, or while
  /// its message would take the pinned total past kMaxOfferedBytes (one
  /// message alone always goes): what a client pins for offers is bounded.
  static constexpr std::uint32_t kMaxOffers = 4;
  static constexpr std::size_t kMaxOfferedBytes = 8u << 20;
  std::unordered_map<std::uint64_t, std::size_t> offers_;
  std::size_t offered_bytes_ = 0;
  std::uint64_t next_offer_ = 0;
  std::uint64_t pings_sent_ = 0;
  std::uint64_t pongs_received_ = 0;
  std::string auth_refusal_;  // the broker's ERROR text when it refused our credentials
  bool logging_in_ = false;   // authenticate() waits for the broker's verdict

  // ---- the I/O loop's own
  Reassembler reassembler_;
  SequencedStreams streams_;
  std::uint64_t pongs_pending_ = 0;  // PONGs decoded, not yet dispatched
  // The last ERROR, whose CLOSE follows it when the broker ends the
  // connection for it (SPEC.md §3.5): the close is reported with it, once.
  proto::ErrorCode last_error_code_ = proto::ErrorCode::kNone;
  std::string last_error_text_;
  struct DeferredFrame {
    std::uint32_t sid;
    proto::FrameType type;
    std::uint64_t sequence;
    std::vector<std::byte> payload;
  };
  std::vector<DeferredFrame> deferred_;

  // ---- the polled loop: progress_mu_ is held by the thread that runs the
  // transport's loop (lock order: progress_mu_, then mu_).
  std::mutex progress_mu_;
  std::atomic<std::uint64_t> turns_{0};  // turns of the loop begun
  /// The turn is a poll()'s (which may sleep for its whole timeout), and how
  /// many threads wait inside the library for the turn: each ends such a
  /// poll's sleep (take_turn). A poll() never ends another thread's sleep:
  /// two waits ending each other's would spin.
  std::atomic<bool> polling_{false};
  std::atomic<int> wanting_turn_{0};

  // ---- ClientStats, any thread
  std::atomic<std::uint64_t> messages_received_{0};
  std::atomic<std::uint64_t> join_failures_{0};
  /// ClientStats::app_wakeups, shared with this session's subscription queues.
  const WakeupCounter app_wakeups_ = std::make_shared<std::atomic<std::uint64_t>>(0);
};

// What an application passes to a publish or subscribe call, checked
// (session.cpp; the session's other parts check with them too).
Status check_subject(std::string_view subject, bool pattern = false);
/// The fields of `headers` as the wire codec takes them, checked; views valid
/// until the calling thread's next call (one vector per thread, reused: a
/// publish with headers allocates nothing once it has grown).
Result<std::span<const proto::HeaderField>> header_fields(const Headers& headers);

}  // namespace rdmabroker
