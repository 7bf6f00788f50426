// SPDX-License-Identifier: Apache-2.0
// The TCP transport of rdmabroker::Client, for hosts without RDMA (SPEC.md
// §1.2). The same frames as over RDMA on a byte stream: the handshake is the
// first 16 bytes each way (24 back), flow control is TCP's window. Frames are
// encoded by Session into send buffers by the application's threads; only
// the I/O thread writes to the socket. A publish wakes it once per batch
// (the first frame after a write was taken), and it writes whatever has been
// filled by the time it runs, without holding the session's lock during the
// system call, so publishers keep filling the next buffer meanwhile: a busy
// publisher pays a memcpy per message and the socket sees large writes, an
// idle one pays one wake-up per message (as the NATS client's flusher does).
//
// tls:// (SPEC.md §1.3) is this transport inside TLS: after the TCP connect,
// a TLS handshake that verifies the broker's certificate against
// tls_ca_file (or the system's CAs) and the host name, then everything
// above through SSL_read/SSL_write. The SSL object is the I/O thread's once
// connected (close() only shuts the socket down; the CLOSE frame, not TLS's
// close_notify, is the orderly end).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "client_internal.hpp"
#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/tls.hpp"
#include "transport.hpp"
#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker {
namespace {

std::string sockaddr_string(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(SessionSide& session, ParsedUrl url) : Transport(session), url_(std::move(url)) {}
  ~TcpTransport() override { close(); }

  Status connect() override;
  void close() override;

 private:
  Status connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject);
  /// connect_once's steps: a connected socket in fd_, then the 16/24-byte handshake.
  Status open_socket(const std::string& where, Clock::time_point deadline);
  /// tls://: the TLS handshake on fd_, the broker's certificate verified.
  Status tls_handshake(const std::string& where, Clock::time_point deadline);
  /// read(2) or SSL_read: > 0 bytes, 0 at the broker's end, < 0 with errno
  /// (EAGAIN: wait; EPROTO: a TLS error, in tls_error_).
  ssize_t read_some(std::byte* to, std::size_t n);
  /// send(2) or SSL_write, without blocking: bytes taken, or < 0 with errno.
  ssize_t write_some(const std::byte* from, std::size_t n);
  Status handshake(std::uint32_t recv_buffer_size, const std::string& where, Clock::time_point deadline,
                   proto::ConnectAccept& accept, proto::ConnectReject* reject);
  /// Waits for `events` on fd_ until `deadline`; false on timeout.
  bool wait_fd(short events, Clock::time_point deadline);
  /// The I/O thread (none for a polled client): progress() until close().
  void run();
  std::size_t progress(int timeout_ms) override;
  void progress_sends() override { write_out(); }
  /// Reads until the socket has no more; returns the messages delivered.
  std::size_t read_available(Deliveries& deliveries, std::vector<Error>& errors);
  void lost_locked(std::vector<Error>& errors, const std::string& why);
  void set_want_write_locked(bool want);
  /// I/O thread: writes every filled send buffer, or until the socket is full.
  void write_out();
  /// Any thread, the socket idle: writes the filled buffers from here, with
  /// the session's lock held; true if all were written. A buffer the socket
  /// did not take whole (or an error) is left in current_ for the I/O thread.
  bool write_directly_locked();

  void transmit_locked() override;
  bool drained_locked() const override { return current_ == SessionSide::kNoBuffer; }

  const ParsedUrl url_;
  const bool tls_ = url_.scheme == "tls";
  UniqueFd fd_;
  tls::UniqueSslCtx tls_ctx_;
  tls::UniqueSsl ssl_;     // after fd_: freed first (it never closes the socket)
  std::string tls_error_;  // what the last TLS failure said
  UniqueFd epoll_;
  std::thread io_thread_;
  std::uint32_t recv_buffer_size_ = 0;  // ours (the handshake's): the longest frame the broker sends
  std::vector<std::byte> rbuf_;         // I/O thread only: bytes of incomplete frames
  std::size_t rlen_ = 0;
  // The loop's state between turns (whoever runs progress()).
  Deliveries deliveries_;
  std::vector<Error> errors_;

  // Guarded by the session's lock: the buffer being written and how far.
  std::uint32_t current_ = SessionSide::kNoBuffer;
  std::uint32_t current_len_ = 0;
  std::uint32_t current_off_ = 0;
  bool want_write_ = false;
  bool write_requested_ = false;  // the I/O thread has been woken to write
  Clock::time_point last_direct_write_{};
  bool socket_watched_ = true;  // I/O thread only: fd_ is in the epoll set
};

// ---------------------------------------------------------------- connect

bool TcpTransport::wait_fd(short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_.get(), events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the next call reports the error
  }
}

Status TcpTransport::connect() {
  const Status st = session_.connect_with_retry(
      [this](std::uint32_t size, proto::ConnectReject* reject) { return connect_once(size, reject); },
      [this] {
        ssl_.reset();
        fd_.reset();
      });
  if (!st) return st;
  if (!session_.options().polled) {
    io_thread_ = std::thread([this] {
      name_this_thread("rb-client-io");
      run();
    });
  }
  return session_.authenticate();
}

Status TcpTransport::connect_once(std::uint32_t recv_buffer_size, proto::ConnectReject* reject) {
  const auto deadline = Clock::now() + session_.options().connect_timeout;
  const std::string where = url_.host + ":" + std::to_string(url_.port);
  recv_buffer_size_ = recv_buffer_size;
  if (auto st = open_socket(where, deadline); !st) return st;
  if (tls_) {
    if (auto st = tls_handshake(where, deadline); !st) return st;
  }
  proto::ConnectAccept accept;
  if (auto st = handshake(recv_buffer_size, where, deadline, accept, reject); !st) return st;
  session_.init_send_buffers(accept,
                             session_.options().max_inflight_sends + session_.options().send_queue_buffers);
  rbuf_.assign(std::size_t{recv_buffer_size} * 2, std::byte{0});
  rlen_ = 0;

  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!wake_fd_ || !epoll_) return sys_error(ErrorKind::kResource, "eventfd/epoll");
  for (int fd : {fd_.get(), wake_fd_.get()}) {
    epoll_event e{};
    e.events = EPOLLIN | (fd == fd_.get() ? EPOLLRDHUP : 0u);
    e.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e);
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local), &len);
  session_.established(std::string(tls_ ? "tls " : "tcp ") +
                       sockaddr_string(reinterpret_cast<sockaddr*>(&local)) + " -> " + where +
                       " (connection " + std::to_string(accept.connection_id) + ")");
  return {};
}

Status TcpTransport::open_socket(const std::string& where, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* dst = nullptr;
  if (int rc = getaddrinfo(url_.host.c_str(), std::to_string(url_.port).c_str(), &hints, &dst); rc != 0) {
    return Error{ErrorKind::kInvalidArgument, "cannot resolve " + url_.host + ": " + gai_strerror(rc)};
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> dst_owner(dst, freeaddrinfo);
  fd_.reset(::socket(dst->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) return sys_error(ErrorKind::kResource, "socket");
  if (!session_.options().bind_address.empty()) {
    addrinfo* src = nullptr;
    if (int rc = getaddrinfo(session_.options().bind_address.c_str(), nullptr, &hints, &src); rc != 0) {
      return Error{ErrorKind::kInvalidArgument,
                   "bad bind address " + session_.options().bind_address + ": " + gai_strerror(rc)};
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> src_owner(src, freeaddrinfo);
    if (::bind(fd_.get(), src->ai_addr, src->ai_addrlen) != 0)
      return sys_error(ErrorKind::kConnectFailed, "bind(" + session_.options().bind_address + ")");
  }
  const int one = 1;
  ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one,
               sizeof one);  // we batch; Nagle would only add delay
  if (::connect(fd_.get(), dst->ai_addr, dst->ai_addrlen) != 0 && errno != EINPROGRESS) {
    return sys_error(ErrorKind::kConnectFailed, "connect(tcp://" + where + ")");
  }
  if (!wait_fd(POLLOUT, deadline))
    return Error{ErrorKind::kTimeout, "connecting to tcp://" + where + ": timed out"};
  int err = 0;
  socklen_t errlen = sizeof err;
  ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &errlen);
  if (err != 0) {
    return Error{ErrorKind::kConnectFailed, "connect(tcp://" + where + "): " + std::strerror(err) +
                                                " (is rdmabrokerd listening on TCP there? --tcp-port)"};
  }
  return {};
}

Status TcpTransport::tls_handshake(const std::string& where, Clock::time_point deadline) {
  const ClientOptions& o = session_.options();
  ERR_clear_error();
  const auto failed = [&](const std::string& what) {
    return Error{ErrorKind::kConnectFailed, what + ": " + tls::take_errors()};
  };
  tls_ctx_.reset(SSL_CTX_new(TLS_client_method()));
  SSL_CTX* ctx = tls_ctx_.get();
  if (ctx == nullptr) return failed("TLS");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (o.tls_ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx) != 1
                            : SSL_CTX_load_verify_locations(ctx, o.tls_ca_file.c_str(), nullptr) != 1) {
    return failed("TLS CA file '" + o.tls_ca_file + "'");
  }
  if (!o.tls_cert_file.empty() || !o.tls_key_file.empty()) {
    if (auto why = tls::use_certificate_and_key(ctx, o.tls_cert_file, o.tls_key_file,
                                                "TLS client certificate", "TLS client key");
        !why.empty()) {
      return Error{ErrorKind::kConnectFailed, why};
    }
  }
  ssl_.reset(SSL_new(ctx));
  if (!ssl_ || SSL_set_fd(ssl_.get(), fd_.get()) != 1) return failed("TLS");
  // The name the broker's certificate must carry: an IP address is checked
  // against its IP SANs, a host name against its DNS SANs (and sent as SNI).
  const std::string& name = o.tls_server_name.empty() ? url_.host : o.tls_server_name;
  in6_addr ip{};
  if (inet_pton(AF_INET, name.c_str(), &ip) == 1 || inet_pton(AF_INET6, name.c_str(), &ip) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_.get()), name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl_.get(), name.c_str());
    SSL_set1_host(ssl_.get(), name.c_str());
  }
  SSL_set_connect_state(ssl_.get());
  while (true) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_.get());
    if (r == 1) return {};
    std::string err;
    switch (tls::classify(ssl_.get(), r, err)) {
      case tls::Io::kWantRead:
      case tls::Io::kWantWrite:
        if (!wait_fd(SSL_want_write(ssl_.get()) ? POLLOUT : POLLIN, deadline))
          return Error{ErrorKind::kTimeout, "tls://" + where + ": the TLS handshake timed out"};
        continue;
      case tls::Io::kClosed:
        return Error{ErrorKind::kConnectFailed, "tls://" + where +
                                                    " closed the connection in the TLS handshake (does the "
                                                    "broker serve TLS there? tls.mode)"};
      case tls::Io::kFailed:
        break;
    }
    // A plain listener answers a ClientHello with a plain reject, which TLS reads as a bad record.
    const bool plain = err.find("wrong version number") != std::string::npos ||
                       err.find("packet length too long") != std::string::npos;
    return Error{ErrorKind::kConnectFailed,
                 "TLS handshake with tls://" + where + " failed: " + err +
                     (plain ? " (the broker does not serve TLS there: tls.mode off?)" : "")};
  }
}

ssize_t TcpTransport::read_some(std::byte* to, std::size_t n) {
  return ssl_ ? tls::read(ssl_.get(), to, n, tls_error_) : ::read(fd_.get(), to, n);
}

ssize_t TcpTransport::write_some(const std::byte* from, std::size_t n) {
  // After EAGAIN, SSL_write is called again with the same bytes: the buffer
  // being written does not change until it is released.
  return ssl_ ? tls::write(ssl_.get(), from, n, tls_error_)
              : ::send(fd_.get(), from, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

Status TcpTransport::handshake(std::uint32_t recv_buffer_size, const std::string& where,
                               Clock::time_point deadline, proto::ConnectAccept& accept,
                               proto::ConnectReject* reject) {
  const std::string url = url_.scheme + "://" + where;
  const auto io_error = [&](const std::string& what) {
    return errno == EPROTO ? Error{ErrorKind::kConnectFailed, what + ": " + tls_error_}
                           : sys_error(ErrorKind::kConnectFailed, what);
  };
  // 16 bytes out, 24 back (an accept, or a reject padded with zeros), and 8
  // more after an accept of version 4 or later (SPEC.md §2.2).
  const auto request = proto::encode(proto::ConnectRequest{recv_buffer_size, 2});
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = write_some(request.data() + sent, request.size() - sent);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_fd(POLLOUT, deadline)) continue;
    if (ssl_ && errno != EPROTO) {
      // TLS 1.3: the broker checks our certificate after our handshake has
      // completed, and its alert (why it refused) waits to be read.
      const int err = errno;
      std::byte alert[64];
      if (read_some(alert, sizeof alert) < 0 && errno == EPROTO)
        return Error{ErrorKind::kConnectFailed, url + " refused the TLS session: " + tls_error_};
      errno = err;
    }
    return io_error("sending the connect request to " + url);
  }
  std::array<std::byte, proto::kConnectAcceptSizeV4> reply{};
  std::size_t got = 0;
  std::size_t want = proto::kConnectAcceptSize;
  while (got < want) {
    // TLS may hold decrypted bytes already: read before waiting.
    const ssize_t n = read_some(reply.data() + got, want - got);
    if (n == 0) return Error{ErrorKind::kConnectFailed, url + " closed the connection during the handshake"};
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) return io_error("reading the handshake reply from " + url);
      if (!wait_fd(POLLIN, deadline)) return Error{ErrorKind::kTimeout, url + ": no handshake reply"};
      continue;
    }
    got += static_cast<std::size_t>(n);
    if (got == proto::kConnectAcceptSize && proto::load<std::uint16_t>(reply.data() + 6) == 0)
      want = proto::accept_size(proto::load<std::uint8_t>(reply.data() + 4));
  }
  if (proto::load<std::uint16_t>(reply.data() + 6) != 0) {  // a reason: rejected
    if (proto::decode(reply, *reject) != proto::HandshakeStatus::kOk) {
      return Error{ErrorKind::kRejected, url + " answered with something other than rdmabroker"};
    }
    return connect_rejected(url, *reject);
  }
  if (auto st = proto::decode(std::span(reply).first(want), accept); st != proto::HandshakeStatus::kOk) {
    return Error{ErrorKind::kConnectFailed,
                 "bad accept from " + url + ": " + std::string(proto::to_string(st))};
  }
  return {};
}

void TcpTransport::close() {
  if (!session_.begin_close()) return;
  // FIN after the CLOSE frame; the broker answers with its own.
  ::shutdown(fd_.get(), SHUT_WR);
  wake();
  if (io_thread_.joinable()) io_thread_.join();
  session_.ended();
  const auto lock = session_.lock();
  fd_.reset();
}

// ---------------------------------------------------------------- sending

void TcpTransport::set_want_write_locked(bool want) {
  if (want_write_ == want || !socket_watched_) return;
  want_write_ = want;
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u);
  e.data.fd = fd_.get();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd_.get(), &e);
}

void TcpTransport::transmit_locked() {
  if (write_requested_ || session_.closed_locked()) return;
  // A publish on an idle connection is written by the publishing thread: a
  // hand-off to the I/O thread costs a wake-up per message at light load
  // (issue 16). Not under TLS (one SSL object must not be read and written
  // by two threads at once), and not within kDirectWriteGap of the last
  // direct write: a busy publisher's frames are left to collect in the
  // buffer for the I/O thread, a write(2) per batch instead of per message.
  // A polled client has no I/O thread to leave them to: it writes at once.
  constexpr auto kDirectWriteGap = std::chrono::microseconds(50);
  if (!tls_ && current_ == SessionSide::kNoBuffer && !want_write_) {
    const auto now = Clock::now();
    if (session_.options().polled || now - last_direct_write_ >= kDirectWriteGap) {
      last_direct_write_ = now;
      if (write_directly_locked()) return;
    }
  }
  // Hand the filled buffers to the I/O thread, waking it once.
  write_requested_ = true;
  wake();
}

void TcpTransport::write_out() {
  auto lock = session_.lock();
  write_requested_ = false;  // frames appended from here on ask again
  while (!session_.closed_locked()) {
    if (current_ == SessionSide::kNoBuffer) {
      std::tie(current_, current_len_) = session_.take_ready_locked();
      current_off_ = 0;
      if (current_ == SessionSide::kNoBuffer) return;
    }
    // The buffer is ours until released: write it without the lock, so
    // publishers fill the next one meanwhile.
    const std::byte* data = session_.send_buffer(current_) + current_off_;
    const std::size_t len = current_len_ - current_off_;
    lock.unlock();
    const ssize_t n = write_some(data, len);
    const int err = errno;
    lock.lock();
    if (n < 0) {
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        set_want_write_locked(true);  // resumed on EPOLLOUT
        return;
      }
      session_.fail_locked(Error{ErrorKind::kClosed, std::string("connection to the broker lost (send: ") +
                                                         (err == EPROTO ? tls_error_ : std::strerror(err)) +
                                                         ")"});
      return;
    }
    current_off_ += static_cast<std::uint32_t>(n);
    if (current_off_ == current_len_) {
      session_.release_send_buffer_locked(std::exchange(current_, SessionSide::kNoBuffer));
      set_want_write_locked(false);
    }
  }
}

bool TcpTransport::write_directly_locked() {
  while (session_.has_ready_locked()) {
    const auto [buffer, len] = session_.take_ready_locked();
    const ssize_t n = write_some(session_.send_buffer(buffer), len);  // plain TCP: send(2), not blocking
    if (n == static_cast<ssize_t>(len)) {
      session_.release_send_buffer_locked(buffer);
      continue;
    }
    // Part of it, none, or an error: the I/O thread goes on from here (and
    // meets the error itself, to report it as it reports any).
    current_ = buffer;
    current_len_ = len;
    current_off_ = n > 0 ? static_cast<std::uint32_t>(n) : 0;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- I/O thread

void TcpTransport::lost_locked(std::vector<Error>& errors, const std::string& why) {
  if (!session_.closed_locked() && !session_.closing_locked())
    errors.push_back(Error{ErrorKind::kClosed, "connection to the broker lost"});
  session_.fail_locked(Error{ErrorKind::kClosed, "connection to the broker lost (" + why + ")"});
}

std::size_t TcpTransport::read_available(Deliveries& deliveries, std::vector<Error>& errors) {
  std::size_t delivered = 0;
  while (true) {
    const ssize_t n = read_some(rbuf_.data() + rlen_, rbuf_.size() - rlen_);
    if (n == 0) {
      ::shutdown(fd_.get(), SHUT_WR);  // answer the broker's FIN with ours
      const auto lock = session_.lock();
      // Mid-frame: the broker cut the connection without its CLOSE reaching
      // us (we did not read for its whole drain time); its log says why.
      lost_locked(errors, rlen_ == 0 ? "closed by the broker"
                                     : "closed by the broker in the middle of a frame, " +
                                           std::to_string(rlen_) + " bytes of it received");
      return delivered;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return delivered;
      const int err = errno;
      const auto lock = session_.lock();
      lost_locked(errors, err == EPROTO ? "TLS: " + tls_error_ : std::strerror(err));
      return delivered;
    }
    rlen_ += static_cast<std::size_t>(n);
    // Whole frames go to the session; an incomplete one waits for more bytes.
    // A frame that can never complete (longer than our buffer) is handed over
    // too, and the session reports it as undecodable.
    const std::size_t whole = proto::whole_frames({rbuf_.data(), rlen_}, recv_buffer_size_);
    session_.on_frames({rbuf_.data(), whole}, deliveries, errors);
    // Messages delivered in place (MessageView) point into rbuf_: they are
    // handed over before its bytes move.
    delivered += session_.dispatch(deliveries, errors);
    std::memmove(rbuf_.data(), rbuf_.data() + whole, rlen_ - whole);
    rlen_ -= whole;
    {
      const auto lock = session_.lock();
      if (session_.closed_locked()) {
        // The broker sent CLOSE (or we failed): nothing more will be sent, so
        // our FIN lets the broker finish at once instead of at its deadline.
        ::shutdown(fd_.get(), SHUT_WR);
        return delivered;
      }
    }
  }
}

void TcpTransport::run() {
  // No tick: reads, EPOLLOUT, publishes and close() all raise an fd event.
  while (!session_.stop_requested()) progress(-1);
}

std::size_t TcpTransport::progress(int timeout_ms) {
  std::size_t delivered = 0;
  epoll_event evs[4];
  const int n = ::epoll_wait(epoll_.get(), evs, 4, timeout_ms);
  if (timeout_ms != 0) count_wakeup();
  bool readable = false;
  bool writable = false;
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.fd == wake_fd_.get()) {
      take_wakeups();
      continue;
    }
    readable |= (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
    writable |= (evs[i].events & EPOLLOUT) != 0;
  }
  bool closed;
  {
    const auto lock = session_.lock();
    closed = session_.closed_locked();
  }
  // Once closed, the socket is not read again, and it leaves the epoll set:
  // its EOF stays readable (level-triggered), and this thread would spin on
  // it until the application called close(). It sleeps on the wake-up fd.
  if (readable && !closed) delivered += read_available(deliveries_, errors_);
  {
    const auto lock = session_.lock();
    closed = session_.closed_locked();
  }
  if (closed && socket_watched_) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd_.get(), nullptr);
    socket_watched_ = false;
  }
  bool write;
  {
    const auto lock = session_.lock();
    write = writable || (write_requested_ && !want_write_);
  }
  if (write) write_out();
  delivered += session_.dispatch(deliveries_, errors_);
  return delivered;
}

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(SessionSide& session, const ParsedUrl& url) {
  return std::make_unique<TcpTransport>(session, url);
}

}  // namespace rdmabroker
