// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: messages larger than a frame, put together from
// the fragments the broker delivers (SPEC.md §3.7), per subscription and
// publisher: each is handed over whole when its last fragment arrives, or
// dropped (and counted) when its publisher aborts it or a fragment is out of
// place. The I/O loop's own: no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <utility>

#include "deliveries.hpp"

namespace rdmabroker {

class Reassembler {
 public:
  /// A fragment (`inner`, of a DELIVER on `sid` whose relay time was
  /// `relay_ns`): the whole message goes into `deliveries` with its last one.
  void on_fragment(std::uint32_t sid, const proto::Frame& inner, std::uint32_t relay_ns,
                   Deliveries& deliveries);
  /// ABORT: `publisher`'s message on `sid` is abandoned.
  void abort(std::uint32_t sid, std::uint64_t publisher) {
    if (partial_.erase({sid, publisher}) != 0) aborted_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Messages begun and never finished (ClientStats::aborted_messages); any thread.
  std::uint64_t aborted() const { return aborted_.load(std::memory_order_relaxed); }

 private:
  struct Partial {
    Message message;
    std::uint32_t length = 0;  // of the whole message (header block included)
    std::uint32_t next = 0;    // offset of the next fragment
  };
  std::map<std::pair<std::uint32_t, std::uint64_t>, Partial> partial_;  // by (sid, publisher)
  std::atomic<std::uint64_t> aborted_{0};
};

}  // namespace rdmabroker
