// SPDX-License-Identifier: Apache-2.0
// librdmabroker: publish and subscribe through rdmabrokerd. Verbs stay hidden:
// connect to "rdma://host:port" (or "tcp://host:port" on a host without RDMA),
// then publish, subscribe (callback or blocking next(), alone or in a queue
// group), request/reply, unsubscribe, flush, close. Every call reports failure
// as a value.
//
// Threading: a Client is safe to use from several threads. Each Client runs
// one internal I/O thread; message callbacks run on it, so a callback must not
// block for long and must not call close() on its own client. A publish on an
// idle connection is sent from the calling thread (RDMA always, TCP but not
// TLS), without waking the I/O thread.
//
// A polled client (ClientOptions::polled) has no I/O thread: the application
// drives it by calling poll() from its own threads, callbacks run inside
// poll(), and a call that waits (flush, request, next, a publish with every
// send buffer taken, connect, close) makes progress itself while it waits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmabroker/result.hpp"

// The public API compiles as C++17 (GCC's default) and C++20; under C++20 a
// ByteView converts to and from ByteView.
#if __cplusplus >= 202002L
#include <span>
#endif

// The library is built with hidden visibility: what this header declares is
// its C++ API, exported; everything else stays inside it.
#pragma GCC visibility push(default)

namespace rdmabroker {

/// A read-only view of bytes (what C++20 calls ByteView,
/// available to C++17 programs too): payloads passed to publish() and seen in
/// a MessageView. Made from a pointer and size, or from any contiguous
/// container of std::byte (std::vector, std::array, std::span); see also
/// as_payload() for text.
class ByteView {
 public:
  using element_type = const std::byte;
  using value_type = std::byte;
  using size_type = std::size_t;
  using iterator = const std::byte*;

  constexpr ByteView() noexcept = default;
  constexpr ByteView(const std::byte* data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <class Container,
            std::enable_if_t<!std::is_same_v<std::decay_t<Container>, ByteView> &&
                                 std::is_convertible_v<decltype(std::declval<const Container&>().data()),
                                                       const std::byte*>,
                             int> = 0>
  constexpr ByteView(const Container& c) noexcept  // NOLINT(google-explicit-constructor): as std::span's
      : data_(c.data()), size_(c.size()) {}
#if __cplusplus >= 202002L
  constexpr operator std::span<const std::byte>() const noexcept { return {data_, size_}; }
#endif

  constexpr const std::byte* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t size_bytes() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr const std::byte* begin() const noexcept { return data_; }
  constexpr const std::byte* end() const noexcept { return data_ + size_; }
  constexpr const std::byte& operator[](std::size_t i) const noexcept { return data_[i]; }
  /// The bytes from `offset` on, `count` of them (all that remain by default).
  constexpr ByteView subspan(std::size_t offset,
                             std::size_t count = static_cast<std::size_t>(-1)) const noexcept {
    return {data_ + offset, count == static_cast<std::size_t>(-1) ? size_ - offset : count};
  }
  constexpr ByteView first(std::size_t count) const noexcept { return {data_, count}; }
  constexpr ByteView last(std::size_t count) const noexcept { return {data_ + size_ - count, count}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Message headers (docs/headers.md): name/value fields in order, NATS style,
/// for tracing ids, content types and the like. A name is printable ASCII
/// without space or ':'; a value any text without CR, LF or NUL; a name may
/// repeat. Lookups compare names without regard to ASCII case; the fields
/// travel as given. They need a broker of protocol version 2 (any
/// rdmabrokerd that has headers); a subscriber of version 1 gets the message
/// without them.
class Headers {
 public:
  /// One field: views into the Headers' own storage, each followed there by
  /// a NUL byte (so `data()` is a C string), valid until it is changed.
  using Field = std::pair<std::string_view, std::string_view>;
  class const_iterator;
  Headers() = default;
  Headers(std::initializer_list<std::pair<std::string_view, std::string_view>> fields);

  /// Appends a field (another value, if the name is there already).
  void add(std::string_view name, std::string_view value);
  /// Replaces every value of `name` with this one.
  void set(std::string_view name, std::string_view value);
  /// The first value of `name`; nullopt if there is none. Views (here and
  /// in values()) are valid until the headers change.
  std::optional<std::string_view> get(std::string_view name) const;
  /// Every value of `name`, in order.
  std::vector<std::string_view> values(std::string_view name) const;
  /// Removes every field named `name`; returns how many there were.
  std::size_t erase(std::string_view name);
  /// Removes every field; the storage is kept for the next ones.
  void clear() {
    text_.clear();
    fields_.clear();
  }

  bool empty() const { return fields_.empty(); }
  std::size_t size() const { return fields_.size(); }
  /// Fields in order (a forward iterator yielding Field by value).
  const_iterator begin() const;
  const_iterator end() const;
  /// The same fields in the same order (names compared exactly).
  bool operator==(const Headers& o) const;
  bool operator!=(const Headers& o) const { return !(*this == o); }

 private:
  // Every name and value back to back in one string, each ended by NUL, and
  // where each field's pair is: a delivered message's headers take two
  // allocations at most, none when a recycled Message has the room already.
  struct Span {
    std::uint32_t name_at = 0, name_len = 0, value_at = 0, value_len = 0;
  };
  Field field(const Span& s) const {
    return {std::string_view(text_).substr(s.name_at, s.name_len),
            std::string_view(text_).substr(s.value_at, s.value_len)};
  }
  std::string text_;
  std::vector<Span> fields_;
};

class Headers::const_iterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = Field;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = Field;
  const_iterator() = default;
  Field operator*() const { return headers_->field(headers_->fields_[i_]); }
  const_iterator& operator++() {
    ++i_;
    return *this;
  }
  const_iterator operator++(int) {
    auto old = *this;
    ++i_;
    return old;
  }
  bool operator==(const const_iterator& o) const { return i_ == o.i_; }
  bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

 private:
  friend class Headers;
  const_iterator(const Headers* h, std::size_t i) : headers_(h), i_(i) {}
  const Headers* headers_ = nullptr;
  std::size_t i_ = 0;
};
inline Headers::const_iterator Headers::begin() const { return {this, 0}; }
inline Headers::const_iterator Headers::end() const { return {this, fields_.size()}; }

/// A message delivered to a subscription (owns its bytes).
struct Message {
  std::uint32_t sid = 0;  // the subscription it was delivered to
  std::string subject;
  std::string reply;  // where the publisher wants an answer; empty: none
  Headers headers;    // empty: the publisher sent none
  std::vector<std::byte> payload;
  std::uint64_t stream_sequence = 0;  // from a stream's consumer (consumer.hpp): its sequence there; else 0
  std::uint32_t deliveries = 0;       // ... and how many times it was delivered, this one included
  std::string_view data() const { return {reinterpret_cast<const char*>(payload.data()), payload.size()}; }
};

class MessageView;
namespace detail {
struct ViewAccess;  // the library's: makes views of what it received
}

/// A delivered message seen in place (Client::subscribe_view): subject, reply,
/// header fields and payload are views into the library's receive buffer (or
/// its reassembly of a message larger than a frame), valid only while the
/// handler runs; the buffer goes back to the broker after it returns. Nothing
/// is copied or allocated to deliver it. To keep anything, copy it, or take
/// the whole message with to_message() / copy_to().
class MessageView {
 public:
  std::uint32_t sid = 0;  // the subscription it was delivered to
  std::string_view subject;
  std::string_view reply;  // where the publisher wants an answer; empty: none
  ByteView payload;
  std::uint64_t stream_sequence = 0;  // as Message's
  std::uint32_t deliveries = 0;
  /// When the library took the message from the transport (the receive
  /// completion, or the read, that completed it): a latency budget measures
  /// the library's own hand-over to the handler from here (`rdmabroker
  /// bench --trace`). The epoch (zero) for a view made of a Message.
  std::chrono::steady_clock::time_point received_at{};
  /// How long the message spent in the broker, from the broker taking it
  /// off the wire to the post of the send that brought it here (SPEC.md
  /// §3.4, "Relay time"; of a DELIVER of several messages, its first's,
  /// which the others spent at most). Zero where the broker does not say: a
  /// broker or a connection of protocol version below 5, a message of a
  /// multicast group, a view made of a Message.
  std::chrono::nanoseconds relay_time{0};

  MessageView() = default;
  /// A view of `m` (valid while `m` is unchanged).
  explicit MessageView(const Message& m);
  std::string_view data() const { return {reinterpret_cast<const char*>(payload.data()), payload.size()}; }
  /// Whether the publisher sent header fields.
  bool has_headers() const;
  /// The first value of header `name` (compared without regard to ASCII
  /// case), read in place; nullopt if there is none.
  std::optional<std::string_view> header(std::string_view name) const;
  /// Every header field, copied.
  Headers headers() const;
  /// The whole message, copied.
  Message to_message() const;
  /// Copies the message into `m`, reusing its storage: a Message kept for
  /// the purpose allocates nothing once it has seen the sizes.
  void copy_to(Message& m) const;
  /// The header block exactly as it arrived (SPEC.md §3.6), for code that
  /// passes the message on unchanged (a broker's route); empty when the
  /// message has none, or when this view is of an owning Message (then
  /// headers() has them).
  ByteView header_block() const { return header_block_; }

 private:
  friend struct detail::ViewAccess;
  ByteView header_block_;             // the header fields as received (SPEC.md §3.6), or
  const Message* message_ = nullptr;  // the owning message this views
};

using MessageHandler = std::function<void(const Message&)>;
/// A handler that sees each message in place (MessageView).
using MessageViewHandler = std::function<void(const MessageView&)>;
/// Asynchronous errors: ERROR frames from the broker, connection loss.
using ErrorHandler = std::function<void(const Error&)>;

/// What a reconnecting client (ClientOptions::reconnect) tells the
/// application about its connection.
struct ConnectionEvent {
  enum class Kind {
    kDisconnected,  // the connection failed; reconnecting has begun (`reason`)
    kReconnected,   // connected again, subscriptions restored: messages published in between were missed
    kGaveUp,        // max_reconnect_attempts reached: the client is closed (`reason`)
  };
  Kind kind = Kind::kDisconnected;
  Error reason{ErrorKind::kClosed, ""};
  std::uint32_t attempts = 0;             // connection attempts this outage took
  std::chrono::milliseconds downtime{0};  // kReconnected: from the failure to the restored subscriptions
  std::size_t subscriptions_restored = 0;
};
using ConnectionEventHandler = std::function<void(const ConnectionEvent&)>;

/// What a stream said about an acknowledged publish (Client::publish_acked,
/// SPEC.md §3.10, docs/streams.md): it holds the message durably.
struct PubAck {
  std::string stream;          // the stream that stored it
  std::uint64_t sequence = 0;  // its sequence in that stream
  bool duplicate = false;      // its Msg-Id was stored before (this sequence): nothing stored again
};

/// What a broker of a cluster says of itself and its peers (INFO: SPEC.md §8,
/// "Gossip"; version 7), when the client connects and whenever that changes.
struct ServerInfo {
  struct Broker {
    std::string id;                   // random at each start of that broker
    std::vector<std::string> urls;    // where clients reach it
    std::vector<std::string> routes;  // where other brokers' routes reach it
  };
  Broker self;  // the broker this client is connected to; empty id: no INFO (yet, or not in a cluster)
  std::string cluster;
  std::vector<Broker> peers;
  /// Every client URL announced: the broker's own, then its peers', once each.
  std::vector<std::string> client_urls() const;
};
using ServerInfoHandler = std::function<void(const ServerInfo&)>;
/// The outcome of Client::publish_acked_async, on the client's I/O thread.
using PubAckHandler = std::function<void(Result<PubAck>)>;

struct ClientOptions {
  /// Local address to bind (selects the RDMA device); empty: let routing choose.
  std::string bind_address;
  /// Size of each receive buffer, 1024 bytes or more. A broker of protocol
  /// version 4 with larger buffers cuts what does not fit into fragments,
  /// reassembled here (SPEC.md §3.7); an older one refuses buffers smaller
  /// than its own, and the connect is retried once with the size it names.
  std::uint32_t recv_buffer_size = 16384;
  /// Receives posted for the broker = credits granted to it.
  std::uint32_t recv_credits = 64;
  /// SENDs in flight before publishes are coalesced into the next one.
  std::uint32_t max_inflight_sends = 8;
  /// Filled send buffers that may wait behind the in-flight ones; a publish
  /// beyond that blocks up to publish_timeout, then fails with kTimeout.
  std::uint32_t send_queue_buffers = 32;
  /// RDMA only: after a completion the I/O thread keeps polling the CQ this
  /// long before it sleeps on the completion channel, so that a message
  /// arriving meanwhile is handed over without a wake-up: lower latency at
  /// light load for a busy core. 0: never spin (the default).
  std::chrono::microseconds busy_poll{0};
  /// RDMA only: the I/O thread (or poll() with a timeout) spins on the CQ
  /// before it sleeps for as long as its recent wake-ups say pays, up to
  /// busy_poll (0: 200 µs), and not at all once idle (the kernel's halt-
  /// polling rule; docs/operations.md, "Adaptive waiting"). At most the
  /// process's cores but one spin at once, across all its clients.
  bool adaptive_poll = false;
  /// Credentials presented when connecting (docs/security.md): a user and
  /// password, or a token, or none (accepted only if the broker allows
  /// anonymous clients). A URL "rdma://user:password@host" or
  /// "rdma://token@host" sets them too. connect() fails with
  /// kAuthenticationFailed when the broker refuses them.
  std::string user;
  std::string password;
  std::string token;
  /// tls://host[:port] (docs/security.md): the CA certificates (PEM file)
  /// that the broker's certificate must chain to; empty: the system's
  /// (/etc/ssl/certs). The certificate must also name the host: the URL's,
  /// or tls_server_name. TLS 1.2 at least.
  std::string tls_ca_file;
  /// Mutual TLS: this client's certificate and private key (PEM files), for
  /// a broker with tls.client_ca (its CN can be the user: docs/security.md).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;  // the name to verify (and SNI); empty: the URL's host
  std::chrono::milliseconds connect_timeout{5000};
  /// Reconnect when the connection fails or the broker restarts: attempts
  /// start after reconnect_delay and back off (doubling, with jitter) to
  /// reconnect_max_delay; subscriptions (same ids, same handlers and queues)
  /// are restored, except those the broker refused or revoked
  /// (PERMISSION_DENIED), and on_connection_event reports the outage. Meanwhile
  /// publish() and request() wait for the connection up to publish_timeout,
  /// then fail with kTimeout; a publish that returned ok just before the
  /// failure may be lost (flush() says whether the broker had it). Off by
  /// default: a failed connection stays failed (kClosed).
  bool reconnect = false;
  std::chrono::milliseconds reconnect_delay{100};
  std::chrono::milliseconds reconnect_max_delay{5000};
  std::uint32_t max_reconnect_attempts = 0;  // per outage; 0: no limit
  ConnectionEventHandler on_connection_event;
  /// With `reconnect`, a broker of a cluster announces the cluster's brokers
  /// (ServerInfo::client_urls()): a reconnect tries the URLs given to
  /// connect() first, then those announced, so a client given one broker's
  /// URL fails over to the others (docs/cluster.md). True: only the URLs given.
  bool ignore_announced_servers = false;
  /// Called with each INFO the broker sends (ServerInfo), on the I/O thread
  /// (a polled client: inside poll() or the call that waits).
  ServerInfoHandler on_server_info;
  std::chrono::milliseconds publish_timeout{5000};
  /// Messages a blocking Subscription buffers before it drops (counted).
  std::size_t subscription_queue_limit = 1u << 20;
  /// RDMA only: offer the broker to receive multicast-backed subjects from a
  /// multicast group (docs/multicast.md). Where the broker takes the offer,
  /// the subscription's messages come from the group, are put in order and
  /// gaps repaired over the connection; the callback or queue sees the same
  /// messages either way. If joining fails the broker sends over the
  /// connection instead (stats().join_failures counts it).
  bool multicast = true;
  /// RDMA, protocol version 8: a message of at least the broker's
  /// `limits.rendezvous_min` is offered by rendezvous (SPEC.md §3.8): the
  /// library copies it into a buffer it registers for the broker to READ,
  /// and the broker takes it in one READ per few hundred KiB instead of a
  /// SEND per frame. At most four such messages, 8 MiB together (or one
  /// larger), are in flight; each buffer is freed when the broker says it
  /// has read it. From version 9 it also lets large messages land
  /// (SPEC.md §3.9): at the first fragment of one, the library registers
  /// the message's memory for the broker to WRITE the rest into, one WRITE
  /// per few hundred KiB instead of a receive per frame (at most four, 8 MiB
  /// together or one larger, at once; deregistered when the message is
  /// whole). False: fragments both ways (§3.7).
  bool rendezvous = true;
  /// No I/O thread: the application calls Client::poll() (Aeron's and UCX's
  /// model). Callbacks run inside poll() on the calling thread, and so do
  /// those of whatever arrives while a call of this client waits (flush(),
  /// request(), Subscription::next(), a publish with no free send buffer,
  /// connect(), close()): a callback must not itself wait on its client
  /// (flush or request from a callback time out), and a lock that callbacks
  /// take must not be held across a call into the client that may make
  /// progress (it waits for the turn that callback holds). Where nothing calls
  /// poll(), nothing is received, send buffers come back only as publishes
  /// wait for them, and the broker treats the client as a slow consumer.
  /// Spin with poll(0) on a core of its own for the lowest latency (no
  /// wake-up at all), or poll(timeout) to sleep when idle. With `reconnect`
  /// too, a thread of the library does the reconnecting (connect, restore
  /// the subscriptions) and calls on_connection_event; poll() keeps
  /// returning (0 while disconnected, having waited up to its timeout for the
  /// next connection) and takes in everything, callbacks included, on the
  /// caller's thread. Without `reconnect`, poll() reports kClosed at the end:
  /// connect again.
  bool polled = false;
  ErrorHandler on_error;
  /// For brokers (rdmabrokerd's routes, SPEC.md §8), not applications: log
  /// in as a route of cluster `route_cluster` (with user and password, the
  /// cluster's route credentials), naming the dialing broker `route_server`.
  /// Needs a broker of protocol version 6.
  std::string route_cluster;
  std::string route_server;
  /// Version 7: the dialing broker's own route URLs, announced in the login
  /// so that the broker it dials can dial back (cluster.advertise).
  std::vector<std::string> route_announce;
};

/// What a client counts about what it received (Client::stats()).
struct ClientStats {
  std::uint64_t messages_received = 0;   // messages handed to subscriptions
  std::uint64_t multicast_messages = 0;  // ... of which came from a multicast group
  std::uint64_t multicast_groups = 0;    // groups joined now
  std::uint64_t join_failures = 0;      // group joins that failed (the broker then sends over the connection)
  std::uint64_t repairs_requested = 0;  // multicast messages asked to be resent (gaps)
  std::uint64_t duplicates = 0;  // copies dropped: a message that came both from the group and the connection
  std::uint64_t messages_lost = 0;  // gone beyond the broker's retransmit window; each loss is also an
                                    // on_error with ErrorKind::kMessagesLost
  /// Wake-ups, the unit cost of latency on an idle core: times the library's
  /// I/O thread returned from a blocking wait (a completion, a socket, a
  /// CM event, a hand-off from the application), and times an application
  /// thread slept inside the library and was woken (next(), flush(),
  /// request(), a full send queue). Divided by messages, the bench's figure.
  std::uint64_t io_wakeups = 0;
  std::uint64_t app_wakeups = 0;
  /// Messages larger than a frame whose fragments began to arrive and that
  /// were never completed: their publisher left or gave up half-way (the
  /// broker's ABORT). None of such a message reaches the application.
  std::uint64_t aborted_messages = 0;
  /// Messages larger than a frame that the broker wrote into their landing
  /// areas (SPEC.md §3.9) rather than sent fragment by fragment.
  std::uint64_t landed_messages = 0;
};

/// A subscription read with next(); created by Client::subscribe(subject).
class Subscription {
 public:
  virtual ~Subscription() = default;
  std::uint32_t sid() const { return sid_; }
  /// Waits for the next message; kTimeout if none arrives in time, kClosed
  /// once the subscription or its client is closed and drained.
  virtual Result<Message> next(std::chrono::milliseconds timeout) = 0;
  /// Messages discarded because the local queue limit was reached.
  virtual std::uint64_t dropped() const = 0;

 protected:
  explicit Subscription(std::uint32_t sid) : sid_(sid) {}

 private:
  std::uint32_t sid_;
};

/// The bytes of `s`, as a payload.
inline ByteView as_payload(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class Consumer;
struct ConsumerOptions;

class Client {
 public:
  /// Connects to "rdma://host[:port]" (default port 7470) or
  /// "tcp://host[:port]" (default port 7471). A comma-separated server list
  /// (brokers of one cluster, docs/cluster.md) connects to the first that
  /// answers; with `reconnect`, a client whose broker fails tries the next
  /// one first, and restores its subscriptions there.
  static Result<std::unique_ptr<Client>> connect(std::string_view url, ClientOptions options = {});
  virtual ~Client() = default;

  /// Queues one message. Returns once it is in a send buffer (not when the
  /// broker has it: use flush()). Fails with kPayloadTooLarge, kInvalidArgument
  /// (bad subject), kClosed, or kTimeout when the send queue stays full.
  virtual Status publish(std::string_view subject, ByteView payload) = 0;
  Status publish(std::string_view subject, std::string_view payload) {
    return publish(subject, as_payload(payload));
  }
  /// Publishes with a reply subject, for a responder to answer to.
  virtual Status publish_request(std::string_view subject, std::string_view reply, ByteView payload) = 0;
  /// Publishes with headers, and a reply subject unless `reply` is empty.
  /// The header block counts against max_payload(). kInvalidArgument for a
  /// bad name or value, or a broker of protocol version 1 (no headers).
  virtual Status publish(std::string_view subject, const Headers& headers, ByteView payload,
                         std::string_view reply = {}) = 0;
  Status publish(std::string_view subject, const Headers& headers, std::string_view payload,
                 std::string_view reply = {}) {
    return publish(subject, headers, as_payload(payload), reply);
  }
  /// Sends a request and waits for the first answer: a reply subject on a
  /// per-connection inbox is made up for it. Fails with kNoResponders at once
  /// when nobody subscribes to `subject`, with kTimeout when nobody answers
  /// within `timeout`.
  virtual Result<Message> request(std::string_view subject, ByteView payload,
                                  std::chrono::milliseconds timeout) = 0;
  Result<Message> request(std::string_view subject, std::string_view payload,
                          std::chrono::milliseconds timeout) {
    return request(subject, as_payload(payload), timeout);
  }
  /// A request with headers; the answer's headers are in the Message.
  virtual Result<Message> request(std::string_view subject, const Headers& headers, ByteView payload,
                                  std::chrono::milliseconds timeout) = 0;
  /// Subscribes with a callback (run on the client's I/O thread). Wildcards
  /// `*` and `>` are allowed (docs/subjects.md).
  virtual Result<std::uint32_t> subscribe(std::string_view subject, MessageHandler handler) = 0;
  /// Subscribes for reading with Subscription::next().
  virtual Result<std::shared_ptr<Subscription>> subscribe(std::string_view subject) = 0;
  /// Joins queue group `group` on `subject`: each message goes to one member
  /// of the group (across all connections), not to every member.
  virtual Result<std::uint32_t> queue_subscribe(std::string_view subject, std::string_view group,
                                                MessageHandler handler) = 0;
  virtual Result<std::shared_ptr<Subscription>> queue_subscribe(std::string_view subject,
                                                                std::string_view group) = 0;
  virtual Status unsubscribe(std::uint32_t sid) = 0;
  /// Round trip to the broker: when it returns ok, everything sent before was
  /// processed by the broker (subscriptions are active, publishes routed), and
  /// whatever the broker sent back before its answer (messages, ERRORs) has
  /// been handed to the callbacks and the error handler.
  virtual Status flush(std::chrono::milliseconds timeout) = 0;
  /// Sends CLOSE after what is queued, disconnects, joins the I/O thread.
  virtual void close() = 0;

  /// Largest payload (header block included) a publish to a subject of this
  /// length may carry: with a broker of protocol version 4, its
  /// limits.max_payload (a larger message than one frame travels as
  /// fragments and arrives whole); before, what one frame holds.
  virtual std::size_t max_payload(std::size_t subject_len) const = 0;
  /// e.g. "rdma rxe1 192.168.77.2 -> 192.168.77.1:7470" or "tcp 10.0.0.2:40112 -> 10.0.0.1:7471"
  virtual std::string transport_description() const = 0;
  /// Why the connection ended, or an empty message while it is open.
  virtual Error close_reason() const = 0;
  /// Counts since the client was created (across reconnects).
  virtual ClientStats stats() const = 0;
  /// The last INFO the broker sent (ServerInfo); an empty `self.id` when it
  /// sent none: a broker not in a cluster, or of protocol version 6 or less.
  virtual ServerInfo server_info() const = 0;

  /// Subscribes with a handler that sees each message in place
  /// (MessageView, valid only during the call): no copy and no allocation per
  /// message, on the client's I/O thread like any callback. A message larger
  /// than a frame is seen once, whole.
  virtual Result<std::uint32_t> subscribe_view(std::string_view subject, MessageViewHandler handler) = 0;
  virtual Result<std::uint32_t> queue_subscribe_view(std::string_view subject, std::string_view group,
                                                     MessageViewHandler handler) = 0;

  /// A polled client (ClientOptions::polled): takes in what has arrived, runs
  /// the callbacks and fills the queues for it, sends what publishes left
  /// queued and the credits the broker is owed, and returns how many messages
  /// it delivered. With nothing arrived it waits up to `timeout` (rounded up
  /// to the millisecond; 0 never waits). One thread at a time makes progress.
  /// kClosed once the connection has ended (its reason went to on_error);
  /// kInvalidArgument for a client with an I/O thread, or from a callback of
  /// this client. It may return 0 early: after wake(), or when another
  /// thread's wait in the library (flush, request, publish, close) needs the turn.
  virtual Result<std::size_t> poll(std::chrono::microseconds timeout = std::chrono::microseconds{0}) = 0;

  /// A polled client: makes the poll() waiting now on another thread return
  /// (0 if nothing arrived), or if none waits, the next one: a wake-up is kept
  /// until a poll() takes it, several make one (UCX's ucp_worker_signal). Safe
  /// from any thread and a callback; a reconnecting client without a
  /// connection ends poll()'s wait for one; a busy-polling poll() sees it when
  /// its spin ends. kInvalidArgument with an I/O thread; kClosed after close().
  virtual Status wake() = 0;

  /// Publishes and waits until a stream has stored the message durably
  /// (storage.sync): its stream and sequence. A `Msg-Id` header makes a
  /// retry after a lost answer safe: within the stream's duplicate window it
  /// is stored once, the answer the first sequence (`duplicate`). Errors:
  /// kNoStream, kStreamFull, kDiskFull, kPayloadTooLarge (above max_msg_size,
  /// or more than one frame), kPermissionDenied, kBrokerError (I/O: publish
  /// again), kTimeout (same Msg-Id), kInvalidArgument (before v10), kClosed.
  virtual Result<PubAck> publish_acked(std::string_view subject, const Headers& headers, ByteView payload,
                                       std::chrono::milliseconds timeout) = 0;
  Result<PubAck> publish_acked(std::string_view subject, std::string_view payload,
                               std::chrono::milliseconds timeout) {
    return publish_acked(subject, Headers{}, as_payload(payload), timeout);
  }
  /// publish_acked without waiting: `done` gets its outcome (kClosed if the
  /// connection ends first); waits while 512 are unanswered. Many share a sync.
  virtual Status publish_acked_async(std::string_view subject, const Headers& headers, ByteView payload,
                                     PubAckHandler done) = 0;
  /// Reads stream `stream` through a consumer (rdmabroker/consumer.hpp).
  virtual Result<std::shared_ptr<Consumer>> consume(std::string_view stream, const ConsumerOptions& options,
                                                    std::chrono::milliseconds timeout) = 0;
};

}  // namespace rdmabroker

#pragma GCC visibility pop
