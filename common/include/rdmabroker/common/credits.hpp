// SPDX-License-Identifier: Apache-2.0
// Credit-based flow control for one connection, one side's view (SPEC.md,
// "Flow control"). Both directions run the same rules:
//   - send side: a SEND may be posted only with a credit; the last credit is
//     kept for a pure credit update, so two peers that both owe credits can
//     never deadlock with zero credits each;
//   - receive side: every receive consumed is owed back to the peer; credits
//     return in the immediate data of the next SEND, or in a zero-byte SEND
//     when half the window is owed or the peer is down to its reserve.
// Version 3 adds credits by demand (SPEC.md §5.1): the receive side may
// grow the window while the peer uses it, keep a consumed credit instead of
// returning it (shrinking the window), and ask the peer to give credits back;
// the send side gives back what it was asked for, keeping its reserve. A SEND
// that gives back r credits counts its own credit as one of them.
// Pure arithmetic, no I/O: unit-tested on its own and used by the daemon and
// the client library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

namespace rdmabroker {

class CreditWindow {
 public:
  /// Credits held back on the send side for pure credit updates.
  static constexpr std::uint32_t kReserve = 1;

  explicit CreditWindow(std::uint32_t window = 0) : window_(window) {}

  // ---- send side: credits the peer granted us
  void add_send_credits(std::uint32_t n) { send_credits_ += n; }
  std::uint32_t send_credits() const { return send_credits_; }
  bool can_send_data() const { return send_credits_ > kReserve; }
  bool can_send_credit_update() const { return send_credits_ > 0; }
  void consume_send() { --send_credits_; }
  /// The peer asks for `n` credits back (version 3); a later ask replaces it.
  void on_release_request(std::uint32_t n) { release_wanted_ = n; }
  /// Whether a SEND should go now to give credits back (there is more than
  /// the reserve to give).
  bool wants_release() const { return release_wanted_ > 0 && send_credits_ > kReserve; }
  /// For the SEND about to be posted: the credits it gives back, its own
  /// included (0: none). At most what was asked, and never the reserve: the
  /// side keeps one credit after this SEND. Call before consume_send().
  std::uint32_t take_release() {
    if (send_credits_ <= kReserve) return 0;
    const std::uint32_t r = std::min({release_wanted_, send_credits_ - kReserve, std::uint32_t{0xffff}});
    release_wanted_ = 0;
    if (r > 0) send_credits_ -= r - 1;  // consume_send() takes the SEND's own
    return r;
  }

  // ---- receive side: credits we granted the peer
  std::uint32_t window() const { return window_; }
  /// Credits the peer may still use (granted, not yet consumed).
  std::uint32_t outstanding() const { return outstanding_; }
  /// Receives consumed and not yet returned.
  std::uint32_t owed() const { return owed_; }
  /// Grants `n` credits without a prior receive (the handshake's initial credits).
  void grant_initial(std::uint32_t n) { outstanding_ += n; }
  /// Widens the window by `n` credits, owed to the peer until the next SEND
  /// carries them (the broker's grant once a connection has authenticated).
  void grow(std::uint32_t n) {
    window_ += n;
    owed_ += n;
  }
  /// A receive from the peer completed. False if the peer had no credit: a
  /// protocol violation (it sent more than it was allowed).
  bool on_receive() {
    if (outstanding_ == 0) return false;
    --outstanding_;
    ++owed_;
    return true;
  }
  /// Keeps up to `n` owed credits instead of returning them: the window
  /// shrinks by what was kept (version 3). Returns how many.
  std::uint32_t withhold(std::uint32_t n) {
    n = std::min(n, owed_);
    owed_ -= n;
    window_ -= n;
    return n;
  }
  /// A received SEND gave back `r` credits, its own included (call after its
  /// on_receive()). False if the peer gave back more than it held.
  bool on_release(std::uint32_t r) {
    if (r == 0) return true;
    if (owed_ == 0 || r - 1 > outstanding_) return false;
    --owed_;  // the SEND's own credit is not owed back
    outstanding_ -= r - 1;
    window_ -= r;
    return true;
  }
  /// Grows the window back to `min` if a give-back (or withholding) left it
  /// smaller: with fewer than 2 credits a peer could never send data.
  void keep_at_least(std::uint32_t min) {
    if (window_ < min) grow(min - window_);
  }
  /// Whether owed credits should go back now even without data to carry them.
  bool should_return() const {
    return owed_ > 0 && (owed_ >= std::max<std::uint32_t>(1, window_ / 2) || outstanding_ <= kReserve);
  }
  /// Takes up to `limit` owed credits for the next SEND's immediate data.
  std::uint32_t take_owed(std::uint32_t limit) {
    const std::uint32_t n = std::min({owed_, limit, std::uint32_t{0xffff}});
    owed_ -= n;
    outstanding_ += n;
    return n;
  }
  /// The connection is gone: clears both sides and returns the credits that
  /// were granted but never used (they no longer claim a posted receive).
  std::uint32_t forfeit() {
    owed_ = 0;
    send_credits_ = 0;
    release_wanted_ = 0;
    return std::exchange(outstanding_, 0);
  }

 private:
  std::uint32_t window_;
  std::uint32_t send_credits_ = 0;
  std::uint32_t outstanding_ = 0;
  std::uint32_t owed_ = 0;
  std::uint32_t release_wanted_ = 0;  // send side: credits the peer asked back
};

}  // namespace rdmabroker
