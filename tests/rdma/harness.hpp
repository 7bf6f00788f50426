// SPDX-License-Identifier: Apache-2.0
// Helpers for the RDMA integration tests (run inside the Soft-RoCE guest):
// a real rdmabrokerd child process, the guest's addresses, deterministic
// payloads, and a raw rdma_cm peer that can send what librdmabroker never
// would (malformed frames, bad handshakes, no reposted receives).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>
#include <functional>
#include <cstdint>
#include <deque>
#include <span>
#include <unistd.h>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rdmabroker/client.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"
#include "rdmabroker/proto/handshake.hpp"
#include "rdmabroker/result.hpp"
#include "test_paths.hpp"

namespace rdmabroker::test {

/// The programs under test, where this build put them (test_paths.hpp says
/// why the build passes relative paths).
inline const std::string& broker_path() {
  static const std::string path = beside_this_program(RDMABROKERD_REL);
  return path;
}
inline const std::string& cli_path() {
  static const std::string path = beside_this_program(RDMABROKER_CLI_REL);
  return path;
}
inline const std::string& c_api_smoke_path() {
  static const std::string path = beside_this_program(C_API_SMOKE_REL);
  return path;
}

/// The guest's two addresses: ADDR1 on rxe0 (veth0), ADDR2 on rxe1 (veth1).
/// Empty when not in the guest; tests then fail (they never skip).
std::string guest_addr1();
std::string guest_addr2();
/// Fails the calling test (fatally) when there is no RDMA to test on.
void require_rdma();

/// Message counts of the volume tests: in full in the release tree, a quarter
/// in the sanitizer trees, where every message costs 5-10x under emulation
/// and a race or memory error shows at any volume.
constexpr std::uint64_t volume(std::uint64_t n) { return RDMABROKER_SANITIZED ? n / 4 : n; }
/// The TSan tree: its RDMA tests run one at a time in the guest, so each of
/// their seconds is a second of CI; its volume tests take less again.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitized = true;
#else
inline constexpr bool kThreadSanitized = false;
#endif

/// A unique port per broker started by this process.
std::uint16_t next_port();

/// Payload for message `seq` of a stream: size from a mix (mostly small, some
/// medium, a few of the largest allowed), bytes derived from seq.
std::vector<std::byte> make_payload(std::uint64_t seq, std::size_t max_payload);
/// The largest payload one PUBLISH frame carries on the brokers' default
/// 16 KiB buffers: the stream tests' largest message (a larger one travels
/// as fragments, SPEC.md §3.7, which tests/rdma/fragments_test.cpp covers).
constexpr std::size_t frame_room(std::size_t subject_len) {
  return proto::max_payload(proto::max_publish_frame(16384), subject_len);
}
/// True if `data` is exactly make_payload(seq, max_payload).
bool check_payload(std::uint64_t seq, std::size_t max_payload, std::span<const std::byte> data);

/// Replaces the file's contents.
void write_file(const std::string& path, const std::string& text);
/// An HTTP answer: its status (0 when there was none) and its body.
struct HttpReply {
  int status = 0;
  std::string body;
};
/// `method` http://127.0.0.1:port/path within `timeout`.
HttpReply http_request(std::uint16_t port, const std::string& path,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10),
                       const std::string& method = "GET");
/// GET http://127.0.0.1:port/path within `timeout`; the body, or "" on failure.
std::string http_get(std::uint16_t port, const std::string& path,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10));
/// Open file descriptors of process `pid`.
std::size_t open_fds(int pid);
/// A /proc/PID/status value in KiB (`key`: "VmRSS:", "VmPin:", ...); -1 if unknown.
long status_kib(int pid, const std::string& key);
/// A process's resident memory, in KiB; -1 if unknown.
inline long rss_kib(int pid) { return status_kib(pid, "VmRSS:"); }
/// Resident memory of a process's mappings smaller than `bytes`, in KiB
/// (/proc/PID/smaps): its heap, arenas and stacks without the broker's
/// buffer pool, one mapping larger than any allocator arena (64 MiB).
long rss_below_kib(int pid, std::uint64_t bytes);

/// A cheap password hash (sha512crypt, 1,000 rounds) for a test's users:
/// the guest emulates the CPU, and what is tested is the check, not the cost.
std::string hash_secret(const std::string& secret, unsigned long rounds = 1000);

/// Starts a program with the given stdin and stdout (-1: the test's own),
/// killed when the test process dies. Safe from a test with threads: the
/// child runs no library code between fork() and exec.
pid_t spawn(const std::vector<std::string>& argv, int stdin_fd = -1, int stdout_fd = -1);

/// Every thread's stack of a running process (gdb), for a failure message.
std::string thread_stacks(pid_t pid);

/// Runs a command with `input` on its stdin; returns its exit status and stdout.
/// A command still running after `timeout` is killed and fails the test, with
/// its threads' stacks.

std::pair<int, std::string> run(std::vector<std::string> argv, const std::string& input = {},
                                std::chrono::seconds timeout = std::chrono::seconds(120));

class BrokerProcess {
 public:
  /// Starts rdmabrokerd on `port` (RDMA) and a port of its own for TCP, with
  /// extra flags; waits until its admin socket answers. Where there is no RDMA
  /// device the broker serves TCP only.
  /// `allow_anonymous`: passes --allow-anonymous (tests of authentication turn it off).
  /// `tcp_port`: 0, a port of its own (next_port()).
  explicit BrokerProcess(std::uint16_t port, std::vector<std::string> extra_args = {},
                         bool allow_anonymous = true, std::uint16_t tcp_port = 0);
  ~BrokerProcess();
  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  bool running() const { return pid_ > 0; }
  std::string url(const std::string& host) const { return "rdma://" + host + ":" + std::to_string(port_); }
  std::string tcp_url(const std::string& host) const {
    return "tcp://" + host + ":" + std::to_string(tcp_port_);
  }
  std::uint16_t port() const { return port_; }
  std::uint16_t tcp_port() const { return tcp_port_; }
  const std::string& admin_socket() const { return admin_socket_; }
  int pid() const { return pid_; }
  std::map<std::string, std::int64_t> stats() const;
  /// Sends one admin command; the JSON reply's text ("" and a test failure
  /// when the broker does not answer).
  std::string admin(const std::string& command) const;
  /// The ids of the open connections, oldest first (admin `connections`).
  std::vector<std::uint64_t> connection_ids() const;
  /// Polls stats until `pred` holds or `timeout` passes; returns the last stats.
  template <typename Pred>
  std::map<std::string, std::int64_t> wait_stats(Pred pred, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto s = stats();
    while (!pred(s) && std::chrono::steady_clock::now() < deadline) {
      usleep(50'000);
      s = stats();
    }
    return s;
  }
  /// Sends `sig` and waits for the exit; returns the exit status, or -1 on
  /// timeout/abnormal exit.
  int stop(int sig, std::chrono::milliseconds timeout);
  /// Stops the broker with `sig` and starts it again on the same ports with
  /// the same flags; returns the old process's exit status.
  int restart(int sig);

 private:
  void launch();

  std::vector<std::string> args_;
  std::uint16_t port_;
  std::uint16_t tcp_port_;
  std::string admin_socket_;
  int pid_ = -1;
};

/// The transport a parametrized test runs over: RDMA in the guest (clients on
/// rxe1, the broker on rxe0, so traffic crosses the soft fabric) or TCP on
/// loopback.
enum class Via { kRdma, kTcp };
std::string to_string(Via v);
void PrintTo(Via v, std::ostream* os);
/// The broker's URL for clients over `via`.
std::string url_via(const BrokerProcess& b, Via via);
/// CLI arguments that reach the broker over `via`: -s URL [-b ADDR].
std::vector<std::string> cli_where(const BrokerProcess& b, Via via);
/// A library client over `via` (generous timeouts for emulation; `opt` may
/// add handlers); fails the calling test when it cannot connect.
std::unique_ptr<Client> connect_via(const BrokerProcess& b, Via via, ClientOptions opt = {});
/// The same, for a test that expects the connect to fail.
Result<std::unique_ptr<Client>> try_connect_via(const BrokerProcess& b, Via via, ClientOptions opt = {});
/// The same to any URL of a broker (e.g. a route listener's), over `via`.
Result<std::unique_ptr<Client>> try_connect_url(const std::string& url, Via via, ClientOptions opt = {});

/// Polls `pred` every 20 ms until it holds (true) or `timeout` passes (false).
bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

/// A reconnecting client's connection events, as the application sees them.
struct ConnectionEvents {
  std::mutex mu;
  std::vector<ConnectionEvent> list;
  std::atomic<int> reconnected{0};
  /// Reconnect on, quick backoff (50 ms to 1 s), events recorded here.
  ClientOptions options();
  std::vector<ConnectionEvent> get();
  bool saw(ConnectionEvent::Kind kind);
};

/// A bare rdma_cm client: handshake bytes and SEND contents are the test's.
class RawPeer {
 public:
  static constexpr std::size_t kMaxRawSend = 64 * 1024;
  ~RawPeer();
  /// Connects with `private_data`; returns the accept/reject private data and
  /// whether it was accepted.
  struct ConnectResult {
    bool accepted = false;
    std::string event;
    std::vector<std::byte> private_data;
  };
  Result<ConnectResult> connect(const std::string& host, std::uint16_t port, const std::string& bind,
                                std::span<const std::byte> private_data,
                                std::uint32_t recv_buffer_size = 16384, std::uint32_t recv_count = 16);
  /// Connects with a valid handshake and sends an anonymous CONNECT; fails
  /// the result if not accepted.
  Status connect_ok(const std::string& host, std::uint16_t port, const std::string& bind,
                    std::uint32_t recv_count = 16);
  /// Posts one SEND_WITH_IMM with these bytes and waits for its completion.
  Status send(std::span<const std::byte> bytes, std::uint32_t imm = 0);
  /// An RDMA WRITE of 8 bytes to `address` under `rkey` of the broker's (which
  /// grants no remote access: the broker's QP goes into the error state).
  /// Waits for its completion; its error, if any.
  Status write_remote(std::uint64_t address, std::uint32_t rkey);
  /// Registers `bytes` for the broker to READ (a rendezvous offer, SPEC.md
  /// §3.8; the QP's remote READ access is turned on first) and, with
  /// `write`, to WRITE (a landing area, §3.9); where and with which rkey.
  /// Kept until revoke() or the peer's end.
  Result<proto::RendezvousRegion> expose(std::span<std::byte> bytes, bool write = false);
  /// Deregisters every region expose() registered: a READ of them fails.
  void revoke() { exposed_.clear(); }
  /// Waits for one receive; returns its bytes (frames) or an error on timeout/disconnect.
  /// `repost`: put the buffer back (false simulates a client that stops reading).
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout, bool repost = true);
  /// Waits for RDMA_CM_EVENT_DISCONNECTED.
  bool wait_disconnected(std::chrono::milliseconds timeout);
  std::uint32_t broker_credits() const { return broker_credits_; }
  std::uint8_t version() const { return version_; }

  /// Set before connect(): how often the broker's QP retries a SEND this
  /// peer has no receive for (the connect parameter; 7 = forever), and how
  /// many of its receives it really posts (default: all it advertises).
  std::uint8_t rnr_retry_count = 7;
  std::optional<std::uint32_t> receives_posted;
  /// connect() returns right after rdma_connect (event "abandoned"), not
  /// waiting for the broker: a peer that gives up at once.
  bool abandon_after_connect = false;
  /// READs of ours the broker may have outstanding (rendezvous, SPEC.md §3.8).
  std::uint8_t responder_resources = 2;

 private:
  verbs::EventChannelPtr channel_;
  verbs::CmIdPtr id_;
  verbs::PdPtr pd_;
  verbs::CqPtr cq_;
  verbs::CmQp qp_;
  std::vector<std::byte> mem_;
  verbs::MrPtr mr_;
  std::vector<verbs::MrPtr> exposed_;  // expose(): the caller owns the bytes
  std::uint32_t recv_size_ = 0;
  std::uint32_t recv_count_ = 0;
  std::uint32_t broker_credits_ = 0;
  std::uint8_t version_ = 1;
  bool disconnected_ = false;
  std::deque<ibv_wc> pending_;  // receives that completed while send() waited
  Status post_and_wait(ibv_send_wr& wr);
};

/// The sequence numbers one subscription received (payloads start with the number).
struct SeqSink {
  std::mutex mu;
  std::vector<std::uint64_t> got;
  MessageHandler handler() {
    return [this](const Message& m) {
      std::lock_guard l(mu);
      got.push_back(std::stoull(std::string(m.data())));
    };
  }
  std::size_t size() {
    std::lock_guard l(mu);
    return got.size();
  }
  /// True if exactly [from, to) arrived, in order, after `skip` others.
  bool exactly(std::uint64_t from, std::uint64_t to, std::size_t skip = 0) {
    std::lock_guard l(mu);
    if (got.size() != skip + (to - from)) return false;
    for (std::uint64_t i = from; i < to; ++i) {
      if (got[skip + (i - from)] != i) return false;
    }
    return true;
  }
  std::string describe() {
    std::lock_guard l(mu);
    return std::to_string(got.size()) + " messages" +
           (got.empty() ? ""
                        : ", first " + std::to_string(got.front()) + ", last " + std::to_string(got.back()));
  }
};

/// Encodes one frame into a vector.
std::vector<std::byte> frame(proto::FrameType type, std::uint32_t arg, std::string_view subject,
                             std::string_view payload = {});
/// Connects `peer` to `broker` advertising 16 receive credits of 16 KiB
/// (it posts as many as peer.receives_posted says) and sends CONNECT and
/// SUBSCRIBE(sid 1, `subject`) in one SEND: a subscriber made to misbehave.
Status connect_and_subscribe(RawPeer& peer, const BrokerProcess& broker, const std::string& subject);
/// Decodes every frame in a SEND's bytes.
std::vector<proto::Frame> frames(const std::vector<std::byte>& bytes);

/// A raw subscriber's byte stream, read to its end: the messages in its
/// whole DELIVER frames, its last whole frame, the bytes of a frame left
/// incomplete after them, and whether anything did not decode.
struct StreamTally {
  std::uint64_t messages = 0;
  std::optional<proto::FrameHeader> last;
  std::size_t trailing = 0;
  bool undecodable = false;
};
StreamTally tally_stream(std::span<const std::byte> bytes);

/// Messages dropped by every stated policy together (the messages.dropped.* counters of `stats`).
inline std::int64_t dropped_total(const std::map<std::string, std::int64_t>& stats) {
  std::int64_t dropped = 0;
  for (const auto& [k, v] : stats) {
    if (k.rfind("messages.dropped.", 0) == 0) dropped += v;
  }
  return dropped;
}

/// Every statistic of `stats` on one line ("key=value ..."), for a failure's message.
inline std::string describe_stats(const std::map<std::string, std::int64_t>& stats) {
  std::string all;
  for (const auto& [k, v] : stats) all += k + "=" + std::to_string(v) + " ";
  return all;
}

/// A bare TCP peer speaking bytes of the test's choosing.
class RawTcp {
 public:
  /// `source`: the loopback address to connect from (127.0.0.0/8 is all
  /// loopback: tests of per-address limits play several hosts with it).
  explicit RawTcp(std::uint16_t port, int rcvbuf = 0, const char* source = nullptr) {
    fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (rcvbuf > 0) ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0)
          << std::strerror(errno);
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  }
  int fd() const { return fd_.get(); }
  void send(std::span<const std::byte> bytes) {
    ASSERT_EQ(::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  /// Reads exactly n bytes (or fewer at EOF/timeout).
  std::vector<std::byte> read(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::vector<std::byte> out(n);
    std::size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t r = ::read(fd_.get(), out.data() + got, n - got);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    out.resize(got);
    return out;
  }
  /// The broker's answer to a connect request: 24 bytes (a reject, or an
  /// accept before version 4), 32 for an accept of version 4 (SPEC.md §2.2).
  std::vector<std::byte> read_reply() {
    auto reply = read(proto::kConnectAcceptSize);
    if (reply.size() == proto::kConnectAcceptSize && proto::load<std::uint16_t>(reply.data() + 6) == 0) {
      const std::size_t size = proto::accept_size(proto::load<std::uint8_t>(reply.data() + 4));
      auto rest = read(size - reply.size());
      reply.insert(reply.end(), rest.begin(), rest.end());
    }
    return reply;
  }
  /// Sends a valid connect request, checks the accept and (unless told not
  /// to) sends an anonymous CONNECT.
  void handshake(std::uint32_t recv_buffer_size = 16384, bool authenticate = true) {
    send(proto::encode(proto::ConnectRequest{recv_buffer_size, 2}));
    auto reply = read_reply();
    proto::ConnectAccept accept;
    ASSERT_EQ(proto::decode(reply, accept), proto::HandshakeStatus::kOk);
    if (authenticate)
      send(frame(proto::FrameType::kConnect, 0, "", ""));  // anonymous: the test brokers allow it
  }
  /// The next whole frame's bytes, or nullopt at EOF or timeout.
  std::optional<std::vector<std::byte>> read_frame(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto whole = read(proto::kHeaderSize, timeout);
    if (whole.size() < proto::kHeaderSize) return std::nullopt;
    const auto body_len = proto::align_up(std::size_t{proto::load<std::uint16_t>(whole.data() + 6)} +
                                          proto::load<std::uint16_t>(whole.data() + 8) +
                                          proto::load<std::uint32_t>(whole.data() + 12));
    auto body = read(body_len, timeout);
    if (body.size() < body_len) return std::nullopt;
    whole.insert(whole.end(), body.begin(), body.end());
    return whole;
  }
  /// Reads frames until one of `type` arrives; returns it.
  std::optional<std::pair<proto::FrameHeader, std::string>> read_until(proto::FrameType type) {
    while (true) {
      auto whole = read_frame();
      if (!whole) return std::nullopt;
      proto::Frame f;
      if (proto::decode_frame(*whole, 1 << 24, f) != proto::DecodeStatus::kOk) return std::nullopt;
      if (f.header.type == type) {
        return std::pair{f.header,
                         std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size())};
      }
    }
  }
  /// Everything until the peer's EOF (or the timeout), `chunk` bytes per
  /// read with `pause` between reads: a reader as slow as the test wants.
  std::vector<std::byte> read_to_end(std::chrono::milliseconds timeout, std::size_t chunk = 65536,
                                     std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
    std::vector<std::byte> out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::byte> buf(chunk);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t r = ::read(fd_.get(), buf.data(), buf.size());
      if (r <= 0) break;
      out.insert(out.end(), buf.begin(), buf.begin() + r);
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
    }
    return out;
  }
  bool closed_by_peer(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::byte b[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t r = ::read(fd_.get(), b, sizeof b);
      if (r <= 0) return true;
    }
    return false;
  }
  void close() { fd_.reset(); }
  /// Writes what the socket takes now (non-blocking); false once the peer is gone.
  bool offer(std::span<const std::byte> bytes) {
    const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (n < 0) {
      pollfd p{fd_.get(), POLLOUT, 0};
      ::poll(&p, 1, 10);
    }
    return true;
  }

 private:
  UniqueFd fd_;
};

/// One connection whose bytes are the test's, over either transport: what a
/// client written from SPEC.md alone sends and sees.
class RawWire {
 public:
  virtual ~RawWire() = default;
  /// One SEND (RDMA) or one write (TCP) with these bytes.
  virtual Status send(std::span<const std::byte> bytes) = 0;
  /// The frames that arrive next (at least one), or none on timeout or close.
  virtual std::vector<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) = 0;
  /// The broker ended the connection (RDMA DISCONNECTED, TCP EOF).
  virtual bool closed_by_peer(std::chrono::milliseconds timeout) = 0;
  /// The broker's accept (SPEC.md §2.2): its version is the connection's.
  proto::ConnectAccept accept;
};
/// Connects with `request` (a valid one by default), and sends an anonymous
/// CONNECT if `anonymous`. Null (and a test failure) if not accepted.
std::unique_ptr<RawWire> raw_wire(const BrokerProcess& b, Via via, bool anonymous = true,
                                  std::optional<proto::ConnectRequest> request = std::nullopt);
/// Reads `w` until `n` messages came in DELIVER frames or `timeout` passed:
/// `on_frame` sees every frame read (any type), `on_message` each message in
/// a DELIVER (views valid during the call). Returns how many messages came.
std::size_t read_delivered(RawWire& w, std::size_t n, std::chrono::milliseconds timeout,
                           const std::function<void(const proto::Frame&)>& on_message,
                           const std::function<void(const proto::Frame&)>& on_frame = nullptr);
/// The reject a broker answers `request` with, over `via`; nullopt if it accepted.
std::optional<proto::ConnectReject> raw_reject(const BrokerProcess& b, Via via,
                                               std::span<const std::byte> request);
/// Reads frames until an ERROR; then expects CLOSE with the same code and the
/// connection's end (SPEC.md §3.5). Returns the ERROR's code and text.
std::pair<proto::ErrorCode, std::string> expect_error_then_close(RawWire& w,
                                                                 std::chrono::milliseconds timeout);

}  // namespace rdmabroker::test
