// SPDX-License-Identifier: Apache-2.0
// OpenSSL for the TCP transport's TLS (SPEC.md §1.3), shared by the broker
// and the client library: owners of the handles, and the one way both read
// an error (the library's queue is per thread, so what a failed call left
// is read on the thread that made it, and cleared).
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace rdmabroker::tls {

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
/// A TLS session. It never owns the socket (SSL_set_fd): the socket's owner
/// declares it before the session, so that the session goes first.
using UniqueSsl = std::unique_ptr<SSL, SslFree>;
using UniqueSslCtx = std::unique_ptr<SSL_CTX, SslCtxFree>;

/// What OpenSSL's error queue holds, oldest first, as one line ("certificate
/// verify failed; ..."), and the queue emptied; `fallback` if it is empty.
inline std::string take_errors(const std::string& fallback = "unknown TLS error") {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    // A failed system call (OpenSSL 3 packs its errno in the code): say it as
    // strerror does, not "error 2147483650".
    const char* reason = ERR_SYSTEM_ERROR(e) ? std::strerror(ERR_GET_REASON(e)) : ERR_reason_error_string(e);
    std::string line = reason != nullptr ? reason : "error " + std::to_string(e);
    if (line == "system lib" || out.find(line) != std::string::npos) continue;  // says nothing more
    out += (out.empty() ? "" : "; ") + line;
  }
  return out.empty() ? fallback : out;
}

/// Loads a certificate chain and its private key (PEM files) into `ctx`, as
/// the broker does for its own and the library for a client certificate.
/// Returns what is wrong, naming the file at fault the way the caller's user
/// knows it (`cert_name` "tls.certificate", `key_name` "TLS client key", ...),
/// or an empty string.
inline std::string use_certificate_and_key(SSL_CTX* ctx, const std::string& cert, const std::string& key,
                                           const std::string& cert_name, const std::string& key_name) {
  // A file that cannot be opened is the usual mistake: its path and errno.
  for (const auto& [name, path] : {std::pair{&cert_name, &cert}, std::pair{&key_name, &key}}) {
    if (std::FILE* f = std::fopen(path->c_str(), "r")) {
      std::fclose(f);
    } else {
      return *name + " " + *path + ": " + std::strerror(errno);
    }
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    return cert_name + " " + cert + ": " + take_errors();
  }
  // OpenSSL checks that the key is the certificate's as it loads it.
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    const std::string why = take_errors();
    if (why.find("mismatch") != std::string::npos) {
      return key_name + " " + key + " does not belong to " + cert_name + " " + cert;
    }
    return key_name + " " + key + ": " + why;
  }
  return {};
}

/// Why a certificate check failed, when it did ("certificate has expired",
/// "unable to get local issuer certificate", "hostname mismatch").
inline std::string verify_failure(const SSL* ssl) {
  const long v = SSL_get_verify_result(ssl);
  return v == X509_V_OK ? std::string() : std::string(X509_verify_cert_error_string(v));
}

/// The outcome of a non-blocking SSL_* call that returned `ret` <= 0.
enum class Io {
  kWantRead,   // wait until the socket is readable, then call again
  kWantWrite,  // wait until it is writable, then call again
  kClosed,     // the peer closed: close_notify, or a FIN without one
  kFailed,     // a TLS or socket error: `error` says which
};

inline Io classify(SSL* ssl, int ret, std::string& error) {
  const int e = SSL_get_error(ssl, ret);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Io::kClosed;
    case SSL_ERROR_SYSCALL: {
      const int err = errno;
      std::string queued = take_errors("");
      // A FIN without close_notify: the protocol's own CLOSE frame, not
      // TLS, says whether the stream ended where it should (SPEC.md §1.3).
      if (queued.empty() && (err == 0 || err == ECONNRESET || err == EPIPE)) return Io::kClosed;
      if (queued.find("unexpected eof") != std::string::npos) return Io::kClosed;
      error = !queued.empty() ? queued : std::strerror(err);
      return Io::kFailed;
    }
    default: {
      std::string why = verify_failure(ssl);
      std::string queued = take_errors();
      error = why.empty() ? queued : queued + " (" + why + ")";
      return Io::kFailed;
    }
  }
}

/// SSL_read as read(2) does it on a non-blocking socket: > 0 bytes, 0 at the
/// peer's end, -1 with errno EAGAIN (call again when the socket is readable,
/// or writable if `wants_write` is set) or EPROTO (a TLS error, in `error`).
inline ssize_t read(SSL* ssl, void* to, std::size_t n, std::string& error, bool* wants_write = nullptr) {
  ERR_clear_error();
  const int r = SSL_read(ssl, to, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
  if (wants_write != nullptr) *wants_write = false;
  if (r > 0) return r;
  switch (classify(ssl, r, error)) {
    case Io::kWantWrite:
      if (wants_write != nullptr) *wants_write = true;
      [[fallthrough]];
    case Io::kWantRead:
      errno = EAGAIN;
      return -1;
    case Io::kClosed:
      return 0;
    case Io::kFailed:
      break;
  }
  errno = EPROTO;
  return -1;
}

/// SSL_write as send(2) does it on a non-blocking socket: bytes taken, or -1
/// with errno EAGAIN (call again with the same bytes: SSL_write's rule),
/// EPIPE (the peer closed) or EPROTO (a TLS error, in `error`). Without
/// renegotiation a write never waits for reading, but a spurious case is
/// treated as a wait too.
inline ssize_t write(SSL* ssl, const void* from, std::size_t n, std::string& error) {
  ERR_clear_error();
  const int r = SSL_write(ssl, from, static_cast<int>(std::min<std::size_t>(n, INT_MAX)));
  if (r > 0) return r;
  switch (classify(ssl, r, error)) {
    case Io::kWantRead:
    case Io::kWantWrite:
      errno = EAGAIN;
      return -1;
    case Io::kClosed:
      errno = EPIPE;
      return -1;
    case Io::kFailed:
      break;
  }
  errno = EPROTO;
  return -1;
}

/// The subject's common name of the peer's certificate ("" without one).
inline std::string peer_common_name(const SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return {};
  char cn[256] = {};
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  X509_free(cert);
  return n > 0 ? std::string(cn, static_cast<std::size_t>(n)) : std::string();
}

/// TLS1_2_VERSION or TLS1_3_VERSION, from tls.min_version ("1.2", "1.3").
inline int protocol_version(const std::string& v) { return v == "1.3" ? TLS1_3_VERSION : TLS1_2_VERSION; }

}  // namespace rdmabroker::tls
