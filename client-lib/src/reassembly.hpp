// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: messages larger than a frame, put together from
// the fragments the broker delivers (SPEC.md §3.7), per subscription and
// publisher: each is handed over whole when its last fragment arrives, or
// dropped (and counted) when its publisher aborts it or a fragment is out of
// place. From version 9 over RDMA a large one may land (§3.9): its memory is
// registered at its first fragment for the broker to WRITE the fragments
// between the first and the last into, and deregistered at its last (or its
// ABORT). The I/O loop's own: no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "deliveries.hpp"

namespace rdmabroker {

/// Where landing areas are registered and announced: the session, over
/// its RDMA transport. I/O thread.
class LandingHost {
 public:
  virtual ~LandingHost() = default;
  /// Registers `length` bytes at `data` for the broker to WRITE into, as the
  /// landing area of (`sid`, `publisher`); its rkey, or none (not registered).
  virtual std::optional<std::uint32_t> expose_for_write(std::uint32_t sid, std::uint64_t publisher,
                                                        std::byte* data, std::size_t length) = 0;
  /// Deregisters that area (nothing if there is none).
  virtual void release_landing(std::uint32_t sid, std::uint64_t publisher) = 0;
  /// Sends RDV_READY for the message whose first fragment came in DELIVER `sequence`.
  virtual void send_ready(std::uint32_t sid, std::uint64_t sequence, const proto::LandingArea& area) = 0;
};

class Reassembler {
 public:
  /// At most this many messages land at once, together at most
  /// kMaxLandingBytes (or one larger message alone): the memory the broker
  /// may write into, pinned while it does, stays bounded.
  static constexpr std::size_t kMaxLandings = 4;
  static constexpr std::size_t kMaxLandingBytes = 8u << 20;

  /// Messages of at least `min` bytes land through `host` (null or 0: none).
  void set_landing(LandingHost* host, std::uint32_t min) {
    host_ = host;
    landing_min_ = min;
  }
  /// A fragment (`inner`, of DELIVER `sequence` on `sid` whose relay time
  /// was `relay_ns`): the whole message goes into `deliveries` with its last one.
  void on_fragment(std::uint32_t sid, std::uint64_t sequence, const proto::Frame& inner,
                   std::uint32_t relay_ns, Deliveries& deliveries);
  /// ABORT: `publisher`'s message on `sid` is abandoned.
  void abort(std::uint32_t sid, std::uint64_t publisher) {
    auto it = partial_.find({sid, publisher});
    if (it == partial_.end()) return;
    drop(it);
  }
  /// Messages begun and never finished (ClientStats::aborted_messages); any thread.
  std::uint64_t aborted() const { return aborted_.load(std::memory_order_relaxed); }
  /// Messages that landed (ClientStats::landed_messages); any thread.
  std::uint64_t landed() const { return landed_.load(std::memory_order_relaxed); }

 private:
  struct Partial {
    Message message;
    std::uint32_t length = 0;      // of the whole message (header block included)
    std::uint32_t next = 0;        // offset of the next fragment
    std::uint32_t header_len = 0;  // its header block (the payload starts after it)
    bool landing = false;          // registered for the broker to WRITE into
  };
  using Key = std::pair<std::uint32_t, std::uint64_t>;  // (sid, publisher)
  /// At a first fragment of a message large enough: registers the rest of
  /// it for the broker's WRITEs if it fits the bounds, and answers either way.
  void try_landing(const Key& key, std::uint64_t sequence, Partial& r);
  /// Lets a message's landing area go.
  void release(const Key& key, Partial& r);
  /// Drops a message begun and not finished (counted).
  void drop(std::map<Key, Partial>::iterator it);

  std::map<Key, Partial> partial_;
  LandingHost* host_ = nullptr;
  std::uint32_t landing_min_ = 0;
  std::size_t landings_ = 0;       // messages landing now
  std::size_t landing_bytes_ = 0;  // their registered bytes
  std::atomic<std::uint64_t> aborted_{0};
  std::atomic<std::uint64_t> landed_{0};
};

}  // namespace rdmabroker
