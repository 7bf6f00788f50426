// SPDX-License-Identifier: Apache-2.0
// Fault injection, for tests only. Built in when CMake's
// RDMABROKER_FAULT_INJECTION is on (the sanitizer trees of scripts/test.sh);
// the packaged broker is built without it, and there `kEnabled` is false, so
// every hook below is discarded at compile time (`if constexpr`) and the
// admin command `fault` answers that it is not built in.
//
// A test arms a fault through the admin socket, one line per fault:
//   fault wc-error CONN      the next completion of CONN's QP (receive or send)
//                            is reported failed, and the QP is moved to the
//                            error state, as a device does after a failed WR
//   fault qp-error CONN      CONN's QP is moved to the error state now
//   fault cm-duplicate N     the next N CM events the workers read are handled twice
//   fault cm-delay MS N      the next N CM events are handled MS milliseconds late
//   fault pool-exhaust       the buffer pool hands out nothing, as if every
//                            buffer were in use: receives are not reposted
//   fault pool-release       it hands them out again
//   fault mcast-drop N       the multicast engine assigns the next N channel
//                            messages their sequence numbers and keeps them for
//                            repair, but does not send them to the groups
//   fault mcast-join-fail N  the broker's next N group joins fail
//   fault worker-stall MS    the first worker loop to see it sleeps MS
//                            milliseconds, as a worker stuck in a system call
//                            would be (liveness: /healthz, the watchdog)
//   fault route-stall MS     at the next change of cluster interest, the routes
//                            of the first worker that has one wait MS
//                            milliseconds before they subscribe to it, as a
//                            slow route would (clients' PONGs must wait for
//                            it: SPEC.md §8)
//   fault sync-fail N        the streams' next N fdatasyncs (the group
//                            commit's, or a segment's at a roll) fail, as
//                            one that reports EIO does
// and, at start (a CQ is sized when it is created), the environment variable
//   RDMABROKER_FAULT_CQ_ENTRIES=N   every worker's send CQs get N entries.
// What the broker must do under each is in docs/testing.md ("Fault injection").
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon::fault {

inline constexpr bool kEnabled = RDMABROKER_FAULT_INJECTION != 0;

enum class Kind : std::uint8_t {
  kWcError,
  kQpError,
  kCmDuplicate,
  kCmDelay,
  kPoolExhaust,
  kPoolRelease,
  kMcastDrop,
  kMcastJoinFail,
  kWorkerStall,
  kRouteStall,
  kSyncFail
};

struct Spec {
  Kind kind = Kind::kWcError;
  std::uint64_t connection = 0;  // wc-error, qp-error
  std::uint32_t count = 1;       // cm-duplicate, cm-delay, mcast-drop, mcast-join-fail, sync-fail
  std::uint32_t delay_ms = 0;    // cm-delay, worker-stall, route-stall
};

/// Parses the words after `fault`; the error names what is wrong.
Result<Spec> parse(std::string_view args);

/// Faults that any worker may pick up (armed by the admin thread).
struct Shared {
  std::atomic<std::uint32_t> cm_duplicates{0};
  std::atomic<std::uint32_t> cm_delays{0};
  std::atomic<std::uint32_t> cm_delay_ms{0};
  std::atomic<std::uint32_t> mcast_drops{0};       // channel messages not to send to their groups
  std::atomic<std::uint32_t> mcast_join_fails{0};  // group joins to fail
  std::atomic<std::uint32_t> worker_stall_ms{0};   // taken whole by one worker, which sleeps that long
  std::atomic<std::uint32_t> route_stall_ms{0};    // taken by the next worker whose routes see new interest
  std::atomic<std::uint32_t> sync_fails{0};        // stream syncs to fail

  /// Takes one from `counter` if any is left.
  static bool take(std::atomic<std::uint32_t>& counter);
};

/// RDMABROKER_FAULT_CQ_ENTRIES, or 0 (not set, or not built in).
std::uint32_t cq_entries_override();

}  // namespace rdmabroker::daemon::fault
