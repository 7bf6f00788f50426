// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: everything a client does above its transport.
//
// A Session owns the protocol state both transports share: subscriptions and
// their delivery (callbacks or blocking queues), the send buffers frames are
// encoded into (one being filled, the filled ones waiting, the rest free),
// PING/PONG flushes, request/reply over a per-connection inbox, and the frame
// decoder for what the broker sends. It owns its Transport (transport.hpp:
// RdmaTransport, TcpTransport), which supplies the connection, an I/O thread
// that feeds received bytes to on_frames(), and transmit_locked(), which moves
// filled buffers to the wire; the transport uses the part of the session
// marked "the transport's side" below.
//
// Locking: mu_ guards all mutable state; callbacks run on the I/O thread
// without it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/proto/info.hpp"
#include "transport.hpp"

namespace rdmabroker {

using Clock = std::chrono::steady_clock;

/// Waits on `cv` until pred() or the deadline; each time the thread slept and
/// woke (notified, spuriously or at the deadline) counts in `wakeups`
/// (ClientStats::app_wakeups). Returns pred().
template <typename Pred>
bool wait_counted(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                  std::atomic<std::uint64_t>& wakeups, Pred pred) {
  while (!pred()) {
    const bool timed_out = cv.wait_until(lock, deadline) == std::cv_status::timeout;
    wakeups.fetch_add(1, std::memory_order_relaxed);
    if (timed_out) return pred();
  }
  return true;
}

/// Where a client's application threads count their wake-ups: shared by the
/// session and its subscription queues (which may outlive it).
using WakeupCounter = std::shared_ptr<std::atomic<std::uint64_t>>;

/// A polled client's way to make progress while a thread waits in it: one
/// turn of its loop, waiting no later than the deadline.
using Driver = std::function<void(Clock::time_point deadline)>;

/// Blocking subscription queue, filled by the I/O thread (or by whoever
/// polls a polled client: then next() drives the client through `drive`).
class QueueSubscription final : public Subscription {
 public:
  QueueSubscription(std::uint32_t sid, std::size_t limit, WakeupCounter wakeups, Driver drive = nullptr)
      : Subscription(sid), limit_(limit), wakeups_(std::move(wakeups)), drive_(std::move(drive)) {}

  Result<Message> next(std::chrono::milliseconds timeout) override;
  std::uint64_t dropped() const override { return dropped_.load(); }

  /// Returns false when the message was dropped (queue limit).
  bool push(Message m);
  void close(const std::string& why);
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  const std::size_t limit_;
  const WakeupCounter wakeups_;
  const Driver drive_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
  bool closed_ = false;
  std::string closed_why_;
  std::atomic<std::uint64_t> dropped_{0};
};

namespace detail {
/// What the library may see of a MessageView that the application may not.
struct __attribute__((visibility("hidden"))) ViewAccess {  // the library's own: not exported
  /// The PUBLISH frame `publish` (of a DELIVER) delivered on `sid`, in place.
  static MessageView of(std::uint32_t sid, const proto::Frame& publish);
  /// The owning message a view was made of; null for one in a receive buffer.
  static const Message* message(const MessageView& v) { return v.message_; }
};
}  // namespace detail

/// An application's MessageHandler as the handler the session calls: a view
/// of an owning message (reassembled, or put in order) is handed over as it
/// is; one in a receive buffer is copied into a Message of the calling
/// thread's that keeps its storage, so it allocates nothing once warm.
MessageViewHandler owning_handler(MessageHandler handler);

/// The messages decoded from one read or completion poll, on their way to
/// the application (I/O thread only). Most are seen in place: their views
/// point into the receive buffer, which the transport keeps from the broker
/// until dispatch() has run. The others are owned here: a message reassembled
/// from fragments, or one put in order from a multicast group. Owned messages
/// are kept from batch to batch, so their strings and vectors keep their
/// capacity.
struct Deliveries {
  /// An owned message's payload keeps its capacity up to this (a frame's
  /// worth, and more); a larger one, a large message's, is freed once handed over.
  static constexpr std::size_t kKeptPayloadCapacity = 1u << 20;
  static constexpr std::size_t kInPlace = ~std::size_t{0};
  struct Entry {
    MessageView view;              // in place; or, of an owned message, only its timing
    std::size_t owned = kInPlace;  // the index of the owned message
  };
  std::vector<Entry> entries;
  std::vector<Message> owned;
  std::size_t owned_count = 0;
  /// When the read or completion being decoded was taken (MessageView::received_at).
  std::chrono::steady_clock::time_point received_at{};

  /// `view` as received now, `relay_ns` in the broker (SPEC.md §3.4).
  void add_in_place(MessageView view, std::uint32_t relay_ns) {
    view.received_at = received_at;
    view.relay_time = std::chrono::nanoseconds(relay_ns);
    entries.push_back(Entry{view, kInPlace});
  }
  /// A message to fill (and hand over) on subscription `sid`, completed
  /// now; `relay_ns`: what its last DELIVER said (0: nothing, a datagram's).
  Message& add_owned(std::uint32_t sid, std::uint32_t relay_ns = 0) {
    if (owned_count == owned.size()) owned.emplace_back();
    MessageView timing;
    timing.received_at = received_at;
    timing.relay_time = std::chrono::nanoseconds(relay_ns);
    entries.push_back(Entry{timing, owned_count});
    Message& m = owned[owned_count++];
    m.sid = sid;
    return m;
  }
  std::uint32_t sid(const Entry& e) const { return e.owned == kInPlace ? e.view.sid : owned[e.owned].sid; }
  bool empty() const { return entries.empty(); }
  /// Forgets what was handed over; keeps the storage.
  void clear() {
    for (std::size_t i = 0; i < owned_count; ++i) {
      if (owned[i].payload.capacity() > kKeptPayloadCapacity) std::vector<std::byte>().swap(owned[i].payload);
    }
    owned_count = 0;
    entries.clear();
  }
};

/// `m` as the application gets the PUBLISH frame `publish` (a decoded frame
/// of a DELIVER or a datagram) on subscription `sid`.
inline void fill_message(Message& m, std::uint32_t sid, const proto::Frame& publish) {
  detail::ViewAccess::of(sid, publish).copy_to(m);
}

class Session final : public Client {
 public:
  explicit Session(ClientOptions options) : opt_(std::move(options)) {}
  /// Closes the transport first: its I/O thread uses the session.
  ~Session() override { close(); }

  /// Connects through `transport` (which the session then owns).
  Status connect(std::unique_ptr<Transport> transport) {
    transport_ = std::move(transport);
    return transport_->connect();
  }
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
  std::size_t max_payload(std::size_t subject_len) const override {
    // Version 4: the broker's limit, in fragments beyond one frame (SPEC.md §3.7).
    if (protocol_version_ >= proto::kFragmentsVersion && max_message_ != 0) return max_message_;
    return frame_room(subject_len, 0);
  }
  /// What one PUBLISH frame with this subject and reply can carry.
  std::size_t frame_room(std::size_t subject_len, std::size_t reply_len) const {
    return proto::max_payload(proto::max_publish_frame(max_frame_), subject_len, reply_len);
  }
  std::string transport_description() const override { return description_; }
  /// The broker's frame limit (its receive buffer size).
  std::uint32_t max_frame() const { return max_frame_; }
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

  // ------------------------------------------------ the transport's side
  static constexpr std::uint32_t kNoBuffer = ~0u;

  /// Runs `attempt` with our receive buffer size and, if the broker refuses
  /// that as too small, once more with the size it names; `reset` undoes a
  /// failed attempt.
  Status connect_with_retry(const std::function<Status(std::uint32_t, proto::ConnectReject*)>& attempt,
                            const std::function<void()>& reset);
  /// The error for a broker's reject, naming `where` and the reason.
  static Error rejected(const std::string& where, const proto::ConnectReject& reject);
  /// True once close() asked the I/O thread to end.
  bool stop_requested() const {
    std::lock_guard lock(mu_);
    return stop_;
  }

  /// Sends CONNECT with the options' credentials (none: anonymous) and waits
  /// for the broker's verdict (SPEC.md §2.4); the I/O thread must be running.
  Status authenticate();

  /// Sets up the send buffers once the broker's frame size is known.
  void init_send_buffers(const proto::ConnectAccept& accept, std::uint32_t count);
  std::byte* send_buf(std::uint32_t i) { return send_mem_.get() + std::size_t{i} * max_frame_; }
  std::span<std::byte> send_memory() { return {send_mem_.get(), std::size_t{send_count_} * max_frame_}; }

  /// Takes the next buffer to put on the wire: a filled one, else the one
  /// being filled (idle: no batching delay). kNoBuffer if there is none.
  std::pair<std::uint32_t, std::uint32_t> take_ready_locked();
  bool has_ready_locked() const { return !ready_.empty() || open_buf_ != kNoBuffer; }
  /// No send buffer is free: the next frame waits for one.
  bool out_of_buffers_locked() const { return free_send_.empty(); }
  /// A buffer the transport is done with (sent, or failed).
  void release_send_buffer_locked(std::uint32_t buffer);

  /// Sends CLOSE, waits (bounded) for it to leave, marks the session closed.
  /// Returns false if the session was never established (nothing to close).
  bool begin_close();

  /// Decodes what the broker sent (whole frames) into deliveries and errors;
  /// hands NO_RESPONDERS, PONG, ERROR and CLOSE to the session.
  void on_frames(std::span<const std::byte> data, Deliveries& deliveries, std::vector<Error>& errors);
  /// Runs callbacks and fills queues, reports errors, then counts the PONGs
  /// that came after them (I/O thread, without mu_). Returns the messages
  /// handed over.
  std::size_t dispatch(Deliveries& deliveries, std::vector<Error>& errors);
  void fail_locked(Error why);

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

  // ---- multicast (SPEC.md §7); I/O thread only
  /// Tells the broker (MCAST_JOINED); `error` empty: joined.
  void join_done(std::uint32_t sid, std::uint64_t epoch, const std::string& error);
  /// A datagram from a group, without the GRH.
  void on_datagram(std::span<const std::byte> datagram, Deliveries& deliveries);
  /// Asks for gaps that have lasted long enough, forgets the state of ended
  /// subscriptions. Returns how many ms until it should run again (-1: no gap).
  int check_gaps();
  /// Groups the transport has joined now (for stats()).
  std::atomic<std::uint64_t> groups_joined_{0};
  std::atomic<std::uint64_t> join_failures_{0};
  /// ClientStats::io_wakeups: the transport's I/O thread counts here.
  std::atomic<std::uint64_t> io_wakeups_{0};
  /// ClientStats::app_wakeups, shared with this session's subscription queues.
  const WakeupCounter app_wakeups_ = std::make_shared<std::atomic<std::uint64_t>>(0);

  Status check_open_locked() const {
    if (closed_) return close_error_;
    return {};
  }

  ClientOptions opt_;
  std::string description_;
  std::uint8_t protocol_version_ = proto::kVersion;  // the broker's answer in the accept
  std::uint32_t max_frame_ = 0;                      // the broker's: largest frame/SEND we may send
  std::uint32_t recv_buffer_size_ = 0;               // ours: largest frame the broker sends us
  std::uint32_t max_message_ = 0;    // version 4: the broker's limits.max_payload (0: one frame)
  std::uint64_t connection_id_ = 0;  // the accept's: a fragment's sequence (SPEC.md §3.7)

  mutable std::mutex mu_;
  std::condition_variable cv_;  // send buffer freed, PONG or reply received, closed
  bool established_ = false;
  bool closed_ = false;
  bool stop_ = false;
  bool closing_ = false;  // close() has begun: a disconnect is ours, not an error
  Error close_error_{ErrorKind::kClosed, ""};
  ServerInfo server_info_;  // the last INFO (SPEC.md §8, "Gossip"); guarded by mu_

 private:
  std::unique_ptr<Transport> transport_;  // null until connect()
  /// Polled: held by the thread that runs the transport's loop (lock order:
  /// progress_mu_, then mu_).
  std::mutex progress_mu_;
  std::atomic<std::uint64_t> turns_{0};  // turns of the loop begun (polled)
  /// The turn is a poll()'s (which may sleep for its whole timeout), and how
  /// many threads wait inside the library for the turn: each ends such a
  /// poll's sleep (take_turn). A poll() never ends another thread's sleep:
  /// two waits ending each other's would spin.
  std::atomic<bool> polling_{false};
  std::atomic<int> wanting_turn_{0};
  enum class Turn { kPoll, kWait };
  /// One turn of the loop (polled): waits up to timeout_ms.
  std::size_t progress(int timeout_ms, Turn turn = Turn::kWait);
  /// progress_mu_, for a wait inside the library or close(): a poll()
  /// holding it is woken rather than waited out.
  std::unique_lock<std::mutex> take_turn();

  struct SubscriptionEntry {
    std::string subject;
    // Shared so that dispatch() can call it without mu_ while unsubscribe()
    // erases the entry, at the cost of one reference count per run of
    // messages rather than a copy of the function per message.
    std::shared_ptr<const MessageViewHandler> handler;  // or
    std::shared_ptr<QueueSubscription> queue;           // one of the two
    bool borrowed_queue = false;  // a ReconnectingClient's: not closed when this session fails
  };
  struct PendingRequest {
    bool done = false;
    bool no_responders = false;
    Message reply;
  };

  /// Encodes a frame into the open send buffer, waiting (up to publish_timeout)
  /// for one if all are taken; `sequence` != 0 is kept as the frame's
  /// sequence; `wait` false: fails at once instead (the I/O thread must not wait
  /// for buffers that only it can free).
  Status append_frame_locked(std::unique_lock<std::mutex>& lock, const proto::FrameHeader& h,
                             std::string_view subject, std::string_view reply, ByteView payload,
                             std::uint64_t sequence = 0, bool wait = true,
                             std::span<const proto::HeaderField> headers = {});
  /// I/O thread: sends a multicast control frame now, or at the next
  /// check_gaps() if every send buffer is taken.
  void send_from_io(std::uint32_t sid, proto::FrameType type, std::uint64_t sequence,
                    std::vector<std::byte> payload);
  struct DeferredFrame {
    std::uint32_t sid;
    proto::FrameType type;
    std::uint64_t sequence;
    std::vector<std::byte> payload;
  };
  std::vector<DeferredFrame> deferred_;  // I/O thread
  Status publish_locked(std::unique_lock<std::mutex>& lock, std::string_view subject, std::string_view reply,
                        ByteView payload, std::uint16_t flags,
                        std::span<const proto::HeaderField> headers = {});
  /// Sends a message larger than a frame as fragments, back to back (other
  /// publishes wait meanwhile); one that fails half-way is abandoned with
  /// ABORT before the next publish.
  Status publish_fragments_locked(std::unique_lock<std::mutex>& lock, std::string_view subject,
                                  std::string_view reply, ByteView payload, std::uint16_t flags,
                                  std::span<const proto::HeaderField> headers);
  bool fragmenting_ = false;    // a publish is sending fragments: other publishes wait (mu_)
  bool abort_pending_ = false;  // a fragmented publish failed half-way: ABORT goes first (mu_)
  /// A fragment of a DELIVER (I/O thread): reassembled per subscription and
  /// publisher, delivered whole when its last fragment arrives.
  void on_fragment(std::uint32_t sid, const proto::Frame& inner, std::uint32_t relay_ns,
                   Deliveries& deliveries);
  struct Reassembly {
    Message message;
    std::uint32_t length = 0;  // of the whole message (header block included)
    std::uint32_t next = 0;    // offset of the next fragment
  };
  std::map<std::pair<std::uint32_t, std::uint64_t>, Reassembly>
      reassembly_;  // by (sid, publisher); I/O thread
  std::atomic<std::uint64_t> aborted_messages_{0};
  /// The request() of both forms: `headers` already checked.
  Result<Message> request_with(std::string_view subject, std::span<const proto::HeaderField> headers,
                               ByteView payload, std::chrono::milliseconds timeout);
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
  /// Makes the inbox at the first request, and waits (until `deadline`)
  /// for the broker's PONG after its SUBSCRIBE: in a cluster that PONG says
  /// the other brokers have its interest too, so a reply from any of them
  /// finds its way back (SPEC.md §8, "Interest in effect").
  Status ensure_inbox_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  /// PING, and wait for its PONG until `deadline`.
  Status flush_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  /// The broker refused or revoked subscription `sid`: a blocking reader's
  /// next() returns kClosed with `why`, a callback gets nothing more.
  void end_subscription(std::uint32_t sid, const std::string& why);
  void on_inbox_message(const MessageView& m);
  /// A DELIVER's messages into `deliveries` (a sequenced one through its
  /// stream); false if it was malformed (the session then failed).
  bool on_deliver(const proto::Frame& f, Deliveries& deliveries, std::vector<Error>& errors);
  /// INFO (SPEC.md §8, "Gossip"): kept for server_info(), passed to
  /// on_server_info. False (the session failed) when it breaks the rules.
  bool on_info(const proto::Frame& f, std::vector<Error>& errors);
  /// ERROR or CLOSE from the broker: reported, and what it ends (a
  /// subscription, the authentication, the session) ends.
  void on_error_frame(const proto::Frame& f, std::vector<Error>& errors);

  /// A multicast-served subscription's message stream: every message has a
  /// channel sequence number; each is delivered once, in order, whichever
  /// path (group or connection) brought it first.
  struct SequencedStream {
    std::uint32_t channel = 0;  // from MCAST_JOIN (0: not told yet)
    bool started = false;
    std::uint64_t next = 0;                  // the next sequence number to deliver
    std::uint64_t tail = 0;                  // the highest known to exist (a heartbeat or a later message)
    std::map<std::uint64_t, Message> early;  // arrived ahead of `next`
    Clock::time_point gap_since{};           // when the current gap was first seen
    Clock::time_point asked_at{};            // when it was last asked for
    bool asked = false;
  };
  /// A multicast message being reassembled from its fragments.
  struct Partial {
    std::vector<std::byte> bytes;
    std::set<std::uint32_t> offsets;  // fragments received (duplicates are ignored)
    std::uint32_t received = 0;
  };
  /// Hands message `seq` of `sid` over (deliver in order, keep early, drop a duplicate).
  void on_sequenced(std::uint32_t sid, std::uint64_t seq, Message&& m, Deliveries& deliveries,
                    bool from_group);
  void deliver_in_order(std::uint32_t sid, SequencedStream& s, Deliveries& deliveries);
  /// MCAST_LOSS: moves past `count` messages from `first`, reports it.
  void on_loss(std::uint32_t sid, std::uint64_t first, std::uint64_t count, std::vector<Error>& errors);
  void send_repair(std::uint32_t sid, std::uint64_t first, std::uint64_t count);

  std::unordered_map<std::uint32_t, SequencedStream> streams_;           // by sid, I/O thread
  std::map<std::pair<std::uint32_t, std::uint64_t>, Partial> partials_;  // (channel, seq), I/O thread
  std::atomic<std::uint64_t> messages_received_{0};
  std::atomic<std::uint64_t> multicast_messages_{0};
  std::atomic<std::uint64_t> repairs_requested_{0};
  std::atomic<std::uint64_t> duplicates_{0};
  std::atomic<std::uint64_t> messages_lost_{0};

  std::unique_ptr<std::byte[]> send_mem_;
  std::uint32_t send_count_ = 0;
  std::vector<std::uint32_t> free_send_;                       // send buffer indices
  std::deque<std::pair<std::uint32_t, std::uint32_t>> ready_;  // (buffer, length) filled, not yet sent
  std::uint32_t open_buf_ = kNoBuffer;                         // being filled
  std::uint32_t open_len_ = 0;
  std::uint64_t next_sequence_ = 1;
  std::uint64_t pings_sent_ = 0;
  std::uint64_t pongs_received_ = 0;
  std::uint64_t pongs_pending_ = 0;  // I/O thread only: PONGs decoded, not yet dispatched
  // I/O thread only: the last ERROR, whose CLOSE follows it when the broker
  // ends the connection for it (SPEC.md §3.5): the close is reported with it, once.
  proto::ErrorCode last_error_code_ = proto::ErrorCode::kNone;
  std::string last_error_text_;
  std::uint32_t next_sid_ = 1;
  std::string auth_refusal_;  // the broker's ERROR text when it refused our credentials
  bool logging_in_ = false;   // authenticate() waits for the broker's verdict
  std::unordered_map<std::uint32_t, SubscriptionEntry> subs_;
  // Request/reply: replies arrive on "<inbox_>.<n>" through one wildcard subscription.
  std::string inbox_;
  std::uint64_t next_request_ = 1;
  std::unordered_map<std::string, PendingRequest> pending_;  // by reply subject
};

}  // namespace rdmabroker
