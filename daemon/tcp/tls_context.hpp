// SPDX-License-Identifier: Apache-2.0
// The broker's TLS configuration as OpenSSL holds it (SPEC.md §1.3,
// docs/security.md): one TlsContext per loaded configuration, immutable.
// A reload builds the next one from the files (so a renewed certificate at
// the same path is picked up) and swaps it into the TlsHolder; a connection
// keeps the context it was accepted with (its SSL holds a reference), so
// nothing already connected is dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "rdmabroker/common/tls.hpp"
#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class TlsContext {
 public:
  /// Loads certificate, key and client CA; the error names the key and file.
  static Result<std::shared_ptr<const TlsContext>> build(const config::TlsSettings& settings);

  /// A server-side session on socket `fd` (null if OpenSSL cannot make one).
  tls::UniqueSsl session(int fd) const;
  config::TlsMode mode() const { return settings_.mode; }
  /// Clients must present a certificate signed by tls.client_ca.
  bool verifies_clients() const { return !settings_.client_ca.empty(); }
  /// "certificate CN=..., valid until ...; clients need a certificate from ..." (logged at start and reload).
  const std::string& description() const { return description_; }
  /// When the broker's certificate expires (seconds since the epoch; exported
  /// for an alert before it does).
  std::int64_t not_after() const { return not_after_; }

 private:
  config::TlsSettings settings_;
  tls::UniqueSslCtx ctx_;
  std::string description_;
  std::int64_t not_after_ = 0;
};

/// The context new connections get: every worker reads it at each TLS
/// accept, a reload replaces it. Null while tls.mode is off.
class TlsHolder {
 public:
  std::shared_ptr<const TlsContext> get() const {
    std::lock_guard lock(mu_);
    return current_;
  }
  void set(std::shared_ptr<const TlsContext> next) {
    std::lock_guard lock(mu_);
    current_ = std::move(next);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const TlsContext> current_;
};

}  // namespace rdmabroker::daemon
