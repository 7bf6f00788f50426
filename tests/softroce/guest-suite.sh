#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the Soft-RoCE guest: the RDMA-labelled ctest tests of each build
# tree given, one tree after the other, RDMABROKER_GUEST_JOBS tests at a time
# (default 3: release 231 -> 185 s, ASan about 700 -> 443 s; tests that share
# a resource, the multicast groups, hold a ctest RESOURCE_LOCK), but the TSan
# tree's RDMABROKER_GUEST_JOBS_TSAN at a time (default 1: a TSan process keeps
# an emulated CPU busy; three at a time took 801 s where one at a time had
# taken 751 s, and stretched single tests up to six times). Prints the counts
# and fails if any test failed or if there is no RDMA device to run on.
# The TSan tree runs only the RDMA tests of the threaded core
# (RDMABROKER_GUEST_TSAN_ONLY, a ctest -R pattern; empty runs them all): the
# worker's completion handling and teardown (a killed subscriber and
# publisher, SIGTERM, a slow consumer cut, a QP in error, late CM events),
# hand-offs between workers and transports, the client library's transport
# threads (polled clients, view handlers, reconnects under load), busy,
# spinning and adaptive workers, the pool's shortage, fragments beside small
# messages, rendezvous with a subscriber that vanishes, the multicast engine
# and a route on its worker: about 210 s at one at a time, where the 54
# tests it ran before 2026-12-02 took 541 s on a slow day. The rest are rules
# one thread applies and volume: they run over RDMA in the release and ASan
# trees, and under TSan over TCP on the host (the same router, workers and
# admin thread; docs/testing.md, "How the suite stays inside CI's 30 minutes").
# The ASan tree leaves out the tests of the CLI's own rules (exit
# codes, printing, its bench and request commands: RDMABROKER_GUEST_ASAN_SKIP):
# each spawns a dozen instrumented CLI processes, 96 s of the guest's CPUs in
# all, for code that runs over TCP under ASan on the host and over RDMA in
# the release tree; the library's RDMA transport under them is every other
# test's. So do the gossip tests (Via/Gossip: what they add is the route
# thread's and the workers' INFO handling, the same over either transport:
# over RDMA in the release tree, over TCP under ASan and TSan on the host).
# ASan also leaves the busy- and adaptive-polling tests (72 s of its run:
# they check how workers and clients wait, code whose memory every other
# test uses; TSan, where their threads meet, runs them), volume tests whose
# paths its other tests walk (eight multicast subscribers, the fan-out across
# devices, a cluster partition, four of the cluster's routing rules whose
# /tcp twins run under ASan on the host), the subscription limits' rules, and
# the isolation test's latency comparison (it runs alone, its 27 s are CI's;
# the pool shares it relies on are checked under ASan in Via/PoolShortage and
# Via/Bounds.BrokerWideQueueBound), the RSS check of a vanished
# subscriber's queue (it skips itself under any sanitizer, so only the
# release tree runs it), and the streams' tests but the one of
# PUB_ACKs over RDMA (the stream engine and its store are the same whatever
# the transport: their /tcp twins run under ASan and TSan on the host), and
# the consumers' but the one that replays from pool buffers over RDMA, and a
# cluster's stream. With an ASan tree in the run, the release tree runs only
# what that tree skips and what only a release tree has (below).
# RDMABROKER_GUEST_FILTER, a ctest -R pattern, runs only the tests it matches;
# RDMABROKER_GUEST_RUNS (default 1) runs the whole set that many times in a row
# in one boot (the flake loop: docs/testing.md).
set -uo pipefail
if [ "${RDMABROKER_GUEST:-}" != 1 ] || ! ibv_devices 2>/dev/null | grep -q rxe; then
  echo "guest-suite: no Soft-RoCE device here: run through tests/softroce/run-in-guest.sh" >&2
  exit 1
fi
TSAN_ONLY='^Relay\.(Killed(Subscriber|Publisher)|SigtermWithClients|SlowConsumerIsCut|BusyPolling|SpinningWorkers|AdaptivePolling|FramesSentRightAfterConnect)|^Mixed\.RdmaAndTcp|^Via/LightLoad\.|^Via/Polled\.APolledClientPublishes|^Via/Resilience\.ClientsReconnectAfterABrokerRestart|^Faults/QpFaults\..*/QpInError|^Faults\.DuplicateAndLateCmEvents|^Via/PoolShortage\.|^Via/Fragments\.SmallMessagesGoOn|^Via/RendezvousRdma\.ASubscriberThatVanishes|^Via/InPlace\.AViewHandler|^Multicast\.ASubjectMovesToMulticast|^Via/Cluster\.ARouteIsAConnectionOfAWorker'
ASAN_SKIP='^Via/(Auth\.CliExitCodes|HeadersTest\.CliPublishes|Routing\.Cli|Gossip\.)|^Relay\.(BusyPolling|AdaptivePolling|FanOutAcrossDevices)|^Multicast\.EightSubscribers|^Via/Cluster\.(APartition|ARestarted|EveryMessageOnce|ARequest|AQueueGroup)|^Via/Bounds\.(BrokerWideSubscriptionLimits|OneTenantAtItsSubscriptionQuota)|^Isolation\.SlowSubscribers|^Via/PoolShortage\.AVanishedSubscribersQueueLeavesOnlyPoolPages|^Via/Streams\.|^Via/StreamAcks\.(AnOlder|EveryBroken|ABrokerKilled|Asynchronous)|^Via/Consumers\.(Each|AMessage|Members|ADurable|AConsumerProcess|APull|ADamaged|Refusals|AReplay|StreamsAre|AReconnecting|AConsumerOf|TheCApi)|^Via/ClusterStreams\.'
# With an ASan tree in the same run, the release tree runs only what the
# ASan tree does not (its skips above, and the tests only a release tree
# has: the Python package's): each RDMA test once, instrumented where it
# can be (docs/testing.md, "How the suite stays inside CI's 30 minutes").
asan_runs=""
for dir in "$@"; do
  if grep -q '^RDMABROKER_SANITIZE:STRING=address$' "$dir/CMakeCache.txt"; then
    asan_runs=$(ctest --test-dir "$dir" -N -L rdma -E "${RDMABROKER_GUEST_ASAN_SKIP-$ASAN_SKIP}" |
      sed -n 's/^ *Test *#[0-9]*: \(.*\)$/\1/p' | sed 's/[][().*+?^$|\\]/\\&/g' | sed 's/.*/^&$/' | paste -sd'|')
  fi
done
passed=0 failed=0
runs=${RDMABROKER_GUEST_RUNS:-1}
for run in $(seq "$runs"); do
[ "$runs" = 1 ] || echo "--- run $run of $runs"
for dir in "$@"; do
  echo "--- rdma tests: $dir"
  start=$(date +%s)
  # TSan/ASan builds need their runtime options; LSan checks every process at exit.
  log="$dir/Testing/rdma-guest.log"
  [ "$runs" = 1 ] || log="$dir/Testing/rdma-guest-run$run.log"  # each run's failures kept
  mkdir -p "$dir/Testing"
  jobs=${RDMABROKER_GUEST_JOBS:-3}
  skip=""
  only=${RDMABROKER_GUEST_FILTER:-}
  if grep -q '^RDMABROKER_SANITIZE:STRING=thread$' "$dir/CMakeCache.txt"; then
    jobs=${RDMABROKER_GUEST_JOBS_TSAN:-1}
    # A filter of the caller's own takes the place of the threaded core's.
    [ -n "$only" ] || only=${RDMABROKER_GUEST_TSAN_ONLY-$TSAN_ONLY}
  elif grep -q '^RDMABROKER_SANITIZE:STRING=address$' "$dir/CMakeCache.txt"; then
    skip=${RDMABROKER_GUEST_ASAN_SKIP-$ASAN_SKIP}
  elif [ -z "$only" ]; then
    skip=$asan_runs
  fi
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$dir" -L rdma -j "$jobs" --output-on-failure --timeout 900 \
    ${only:+-R "$only"} ${skip:+-E "$skip"} 2>&1 | tee "$log" | awk '
      # The summary lines, and after an assertion failure the lines that say
      # what failed and why (the log stays in the build tree, but a CI record
      # keeps only what is printed).
      /Test +#|tests passed|FAILED|ERROR|WARNING: ThreadSanitizer|AddressSanitizer/ { print; next }
      /: Failure$/ { print; after = 8; next }
      after > 0 { print; after-- }' || true
  p=$(grep -cE "Test +#.*Passed" "$log")
  # ctest marks a failure in its status column ("***Failed", "***Timeout",
  # "***Exception: ...", "***Not Run"), never to be confused with a test name.
  f=$(grep -cE "Test +#.*\*\*\*(Failed|Timeout|Exception|Not Run)" "$log")
  if [ "$p" = 0 ] && [ "$f" = 0 ]; then f=1; echo "guest-suite: no test ran in $dir" >&2; fi
  passed=$((passed + p)) failed=$((failed + f))
  echo "--- $dir: $p passed, $f failed in $(( $(date +%s) - start )) s, $jobs at a time"
done
done
echo "rdma: $passed passed, $failed failed"
[ "$failed" = 0 ]
