// SPDX-License-Identifier: Apache-2.0
// Settings of one broker instance: what config/rdmabroker.yaml sets, key by
// key (docs/configuration.md), with the built-in defaults. Plain data; the
// loader (config.hpp) fills it and validates it, the broker sizes its verbs
// resources from it (docs/architecture.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace rdmabroker::config {

/// Whether the broker serves RDMA: kAuto uses it when a device exists and
/// otherwise runs TCP-only (and says so); kOn refuses to start without it.
enum class RdmaMode { kAuto, kOn, kOff };

/// Which subjects a user may publish to or subscribe to (docs/security.md):
/// allowed when an `allow` pattern matches (publish) or covers (subscribe)
/// and no `deny` pattern matches (publish) or intersects (subscribe).
struct SubjectRules {
  std::vector<std::string> allow{">"};
  std::vector<std::string> deny;
  bool operator==(const SubjectRules&) const = default;
};

/// What a user may do with streams (docs/security.md, "Streams"): the
/// patterns are over stream names (`read`) and over `STREAM.CONSUMER`
/// (`join`), matched like subjects (a name is one token: `*` or `>` is any).
/// Every message a consumer delivers passes `subscribe` as well.
struct StreamPermissions {
  SubjectRules read;          // open consumers of these streams (and own durables there)
  SubjectRules join{{}, {}};  // join durable consumers that another user owns
  bool operator==(const StreamPermissions&) const = default;
};

struct Permissions {
  SubjectRules publish;
  SubjectRules subscribe;
  StreamPermissions streams;
  bool operator==(const Permissions&) const = default;
};

/// One configured user, with exactly one credential: a password (the client
/// presents name and password) or a token (the client presents the token
/// alone), both crypt(3) hashes (`rdmabroker passwd`); or a certificate (a
/// TLS client whose verified certificate's subject CN is the name, tls.client_ca).
struct User {
  std::string name;
  std::string password_hash;
  std::string token_hash;
  bool certificate = false;
  Permissions permissions;
  bool operator==(const User&) const = default;
};

struct AuthSettings {
  bool anonymous = false;  // clients without credentials are accepted (only when the config says so)
  Permissions anonymous_permissions;  // what they may do
  std::vector<User> users;
  // Logins under attack (docs/security.md, "Password guessing and connection floods").
  std::uint32_t timeout_ms = 3000;       // from connecting to an accepted CONNECT (its verdict included)
  std::uint32_t failure_delay_ms = 250;  // an address's first failed login delays its next check this long,
  std::uint32_t failure_delay_max_ms = 30000;  // doubling per failure up to this; a success resets it
  std::uint32_t cache_ttl_s = 600;  // a verified credential is accepted again without crypt(3) for this long
  bool operator==(const AuthSettings&) const = default;
};

/// Hardware multicast fan-out (docs/multicast.md): subjects matching
/// `subjects` are sequenced by the broker's multicast engine and, once
/// `threshold` subscribers that can join are there, sent as one UD multicast
/// per device instead of one RC send per subscriber; back to RC sends when
/// fewer than `leave_below` remain (hysteresis).
struct MulticastSettings {
  bool enabled = false;
  std::string groups = "239.77.0.0/16";  // IPv4 multicast range group addresses are taken from
  std::vector<std::string> subjects;     // patterns of multicast-backed subjects (live)
  std::uint32_t threshold = 1;    // multicast-capable subscribers at which a subject joins a group (live)
  std::uint32_t leave_below = 1;  // ... and below which it leaves it again (live, <= threshold)
  std::uint32_t retransmit_window = 4096;  // messages per subject kept for gap repair
  bool operator==(const MulticastSettings&) const = default;
};

/// TLS on the TCP listener (docs/security.md, SPEC.md §1.3).
enum class TlsMode {
  kOff,       // plain TCP only
  kOptional,  // TLS or plain on the same port (the broker tells them apart by the first byte)
  kRequired,  // TLS only: a plain client is refused (TLS_REQUIRED), so no credential travels in clear
};

struct TlsSettings {
  TlsMode mode = TlsMode::kOff;
  std::string certificate;  // PEM file: the broker's certificate (chain)
  std::string key;          // PEM file: its private key
  std::string client_ca;    // PEM file: set, clients must present a certificate it signed (mutual TLS)
  std::string min_version = "1.2";  // "1.2" or "1.3"
  bool operator==(const TlsSettings&) const = default;
};

/// Routes to the other brokers of a cluster (docs/cluster.md, SPEC.md §8):
/// this broker logs in to each broker in `routes` as a route and takes the
/// messages its own clients want from there; the other brokers do the same
/// here. Routes present and are checked against `user` and `password`, never
/// against auth.users: a client credential does not open a route.
struct ClusterSettings {
  std::string name;                 // the cluster's name; empty: not in a cluster (route logins refused)
  std::vector<std::string> routes;  // the other brokers, rdma://host[:port] or tcp://host[:port] (live)
  std::string user;                 // the route credentials, the same on every broker of the cluster
  std::string password;
  // Listeners of their own for routes (cluster.listen_rdma, cluster.listen_tcp;
  // port 0: none). With either set, routes log in only there and clients are
  // refused there; with neither, routes log in on the client listeners.
  std::string listen_rdma_address;
  std::uint16_t listen_rdma_port = 0;
  std::string listen_tcp_address;
  std::uint16_t listen_tcp_port = 0;
  bool has_route_listener() const { return listen_rdma_port != 0 || listen_tcp_port != 0; }
  // Gossip (SPEC.md §8, protocol version 7): where other brokers' routes
  // reach this one (announced in its route logins and INFO, so brokers it
  // does not list dial back and a full mesh forms from partial lists), and
  // where clients reach it (announced to clients, their failover list).
  // Empty: the route (or client) listeners that name a host; a listener on
  // a wildcard address (0.0.0.0, ::) is not announced.
  std::vector<std::string> advertise;
  std::vector<std::string> client_advertise;
  bool operator==(const ClusterSettings&) const = default;
};

/// What a stream does with a new message once it is at its limits.
enum class StreamDiscard { kOld, kNew };
/// When stored messages are synced to disk (storage.sync).
enum class StreamSync {
  kGroup,   // within storage.sync_interval_ms of being stored, many in one fdatasync
  kAlways,  // before the broker takes the next message
  /// Synced every sync_interval_ms, and a PUB_ACK sent once the message is
  /// written (in the page cache): it survives the broker's crash, not the
  /// host's (NATS JetStream 2.9's own policy).
  kInterval,
};

/// One stream (docs/streams.md): the subjects it captures, its retention
/// (0: no limit) and what a full stream does.
struct StreamSettings {
  std::string name;                   // [A-Za-z0-9_-], 1..64: also its directory's name
  std::vector<std::string> subjects;  // patterns; no two streams' intersect
  std::uint64_t max_msgs = 0;
  std::uint64_t max_bytes = 0;
  std::uint64_t max_age_s = 0;
  std::uint64_t max_msgs_per_subject = 0;
  std::uint64_t max_msg_size = 0;
  StreamDiscard discard = StreamDiscard::kOld;
  std::uint64_t duplicate_window_s = 120;    // Msg-Id headers remembered this long (0: no detection)
  std::uint64_t duplicate_ids_max = 100000;  // and at most this many: the oldest go first (bounds its memory)
  bool operator==(const StreamSettings&) const = default;
};

/// Where and how streams keep their messages.
struct StorageSettings {
  std::string directory = "/var/lib/rdmabroker/streams";  // a directory per stream
  StreamSync sync = StreamSync::kGroup;                   // live
  std::uint32_t sync_interval_ms = 10;                    // live
  bool operator==(const StorageSettings&) const = default;
};

struct BrokerOptions {
  std::string listen_address = "0.0.0.0";
  std::uint16_t port = 7470;  // RDMA CM port
  RdmaMode rdma = RdmaMode::kAuto;
  std::string tcp_listen_address;        // empty: listen_address
  std::uint16_t tcp_port = 7471;         // 0: no TCP listener
  std::uint32_t workers = 0;             // 0: one per core, at most 8
  std::uint32_t buffer_size = 16384;     // receive buffer = largest frame, bytes
  std::uint32_t pool_buffers = 8192;     // buffers in the shared pool
  std::uint32_t srq_depth = 1024;        // receives per SRQ (one SRQ per worker and device)
  std::uint32_t credits = 32;            // most receive credits a client holds (SPEC.md §5.1)
  std::uint32_t max_inflight_sends = 8;  // SENDs in flight per connection before batching
  std::uint32_t busy_poll_us = 0;  // a worker spins on its CQs this long after its last work before sleeping
  bool adaptive_poll = false;      // the spin tunes itself (AdaptiveSpin), bounded by busy_poll_us or 200 µs
  std::uint64_t max_pending_bytes = 64u
                                    << 20;  // queued frame bytes per subscriber before it is a slow consumer
  std::uint32_t write_deadline_ms =
      2000;  // a subscriber with queued data and no send progress this long is a slow consumer
  std::uint32_t producer_stall_ms = 100;  // credits withheld from a publisher feeding a backlogged subscriber
  std::uint32_t max_connections = 1024;
  // Connections that have not authenticated yet, broker-wide and from one address (docs/security.md).
  std::uint32_t max_unauthenticated = 0;               // 0: a quarter of max_connections
  std::uint32_t max_unauthenticated_per_address = 32;  // at most max_unauthenticated
  std::uint32_t frame_timeout_ms = 10000;  // a TCP frame begun and not finished within this is an error
  /// A message in fragments whose next fragment does not come within this,
  /// while its publisher could send it, is abandoned (SPEC.md §3.7).
  std::uint32_t fragment_timeout_ms = 10000;
  std::uint32_t max_subscriptions = 10000;  // per connection
  // Broker-wide bounds on what clients can make the broker hold (docs/security.md, "Memory budget").
  std::uint32_t max_subscriptions_total = 1'000'000;   // subscriptions of all connections together
  std::uint64_t max_subscription_memory = 256u << 20;  // their estimated heap (SubscriptionBudget::cost)
  /// The part of both that one user's connections together (an anonymous
  /// client's address's; a route is bound by the broker-wide ones only) may
  /// take, in percent: one tenant at its quota leaves room for the others.
  std::uint32_t user_subscription_share_percent = 10;
  // Stream consumers (docs/security.md, "Streams"): how many there may be,
  // how fast one connection may open them, how long an unused durable lives.
  std::uint32_t max_consumers_per_stream = 1000;
  std::uint32_t max_durables_per_user = 1000;  // durable consumers one user (all anonymous clients: one) owns
  std::uint32_t max_consumers_total = 100000;
  std::uint32_t consumer_opens_per_second = 100;  // CONSUMEs per connection (a burst of as many)
  std::uint32_t consumer_inactive_threshold_s =
      0;  // a durable without members this long is removed (0: never)
  std::uint64_t max_pending_bytes_total = 256u
                                          << 20;  // frame bytes (+128 per message) queued for all subscribers
  // Each client's share of the buffer pool (docs/security.md, "Pool shares"):
  // the most of it that one connection's out-queue, and one user's (an
  // anonymous address's) connections together, may hold, in percent.
  std::uint32_t pool_share_percent = 12;
  std::uint32_t user_pool_share_percent = 25;
  std::uint32_t send_blocks = 4096;       // registered send blocks per worker (headers/control frames)
  std::uint32_t drain_timeout_ms = 2000;  // how long a closing connection may flush its last frames
  std::string admin_socket = "/run/rdmabroker/admin.sock";  // `rdmabroker stat`/`reload`; empty: none
  std::vector<std::string> devices;                         // RDMA devices to use (e.g. rxe0); empty: all
  /// Largest message accepted (payload, header block included); larger than a
  /// frame, it travels as fragments (SPEC.md §3.7). 0: one frame's worth, no fragments.
  std::uint32_t max_payload = 1u << 20;
  /// Over RDMA, protocol version 8: a message of at least this many bytes
  /// (payload and header block) may be offered by rendezvous, the broker
  /// READing it from the publisher's memory instead of taking it in
  /// fragments (SPEC.md §3.8). 0: no rendezvous.
  std::uint32_t rendezvous_min = 64u << 10;
  AuthSettings auth;  // who may connect and what they may do (live)
  TlsSettings tls;    // TLS on the TCP listener (live: a reload reloads the files too)
  MulticastSettings multicast;
  ClusterSettings cluster;
  StorageSettings storage;
  std::vector<StreamSettings> streams;  // live: added, changed and removed on reload

  /// The limits on connections not authenticated yet, as they take effect.
  std::uint32_t unauthenticated_limit() const {
    return max_unauthenticated != 0 ? max_unauthenticated : std::max<std::uint32_t>(1, max_connections / 4);
  }
  std::uint32_t unauthenticated_per_address_limit() const {
    return std::min(max_unauthenticated_per_address, unauthenticated_limit());
  }
};

enum class LogFormat { kText, kJson };
enum class LogTarget { kAuto, kConsole, kJournald };  // auto: journald when started by systemd

struct LogSettings {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  LogFormat format = LogFormat::kText;
  LogTarget target = LogTarget::kAuto;
  bool operator==(const LogSettings&) const = default;
};

/// Everything the YAML file sets.
struct Config {
  BrokerOptions broker;
  LogSettings log;
  std::string metrics_listen = "127.0.0.1:9464";  // Prometheus pull endpoint; empty: none
  /// The keys (e.g. "listen.tcp") the file set; the rest are defaults or
  /// flags. Says where an effective value came from; never compared by diff().
  std::set<std::string> file_keys;
};

}  // namespace rdmabroker::config
