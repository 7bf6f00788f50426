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
# The TSan tree runs the RDMA tests of the threaded core, not those of rules
# that one thread applies (RDMABROKER_GUEST_TSAN_SKIP, a ctest -E pattern,
# says which; empty runs them all): the tests of protocol, CLI, admin,
# authentication and routing rules run in the release and ASan trees over
# RDMA, and under TSan over TCP on the host (the same router, workers and
# admin thread). What TSan needs RDMA for, the worker's completion handling,
# hand-offs between workers, the client library's transport threads, polled
# clients, reconnects, QP and CM faults, fragments and the multicast engine,
# it still runs (docs/testing.md, "How the suite stays inside CI's 30 minutes").
# Nor the isolation test's latency comparison (it runs alone: its seconds are
# CI's), whose compaction and pool shares TSan checks in the unit tests on
# the host and in Via/PoolShortage over RDMA.
# The ASan tree likewise leaves out the tests of the CLI's own rules (exit
# codes, printing, its bench and request commands: RDMABROKER_GUEST_ASAN_SKIP):
# each spawns a dozen instrumented CLI processes, 96 s of the guest's CPUs in
# all, for code that runs over TCP under ASan on the host and over RDMA in
# the release tree; the library's RDMA transport under them is every other
# test's. So do the gossip tests (Via/Gossip: what they add is the route
# thread's and the workers' INFO handling, the same over either transport:
# over RDMA in the release tree, over TCP under ASan and TSan on the host).
# ASan also leaves the busy- and adaptive-polling tests (72 s of its run:
# they check how workers and clients wait, code whose memory every other
# test uses; TSan, where their threads meet, runs them), and three volume
# tests whose paths its other tests walk: eight multicast subscribers (the
# other multicast tests, with repairs and losses, run under it), the fan-out
# across devices, and a cluster partition (its /tcp twin runs under ASan on
# the host): 122 s of its run. TSan leaves what is
# volume more than threads (eight multicast subscribers, 16 MiB fragmented
# messages), rules (a message left open, brokers sharing groups, a stuck
# worker's health probes) and one of its two route restarts (a killed
# broker's stays): 72 s of its one-at-a-time run, whose /tcp twins run on
# the host.
# RDMABROKER_GUEST_FILTER, a ctest -R pattern, runs only the tests it matches;
# RDMABROKER_GUEST_RUNS (default 1) runs the whole set that many times in a row
# in one boot (the flake loop: docs/testing.md).
set -uo pipefail
if [ "${RDMABROKER_GUEST:-}" != 1 ] || ! ibv_devices 2>/dev/null | grep -q rxe; then
  echo "guest-suite: no Soft-RoCE device here: run through tests/softroce/run-in-guest.sh" >&2
  exit 1
fi
TSAN_SKIP='^Via/(Auth|HeadersTest|Ops|Routing|Bounds|RouteListeners|Gossip)\.|^Via/Cluster\.(EveryMessageOnce|AQueueGroup|ARequest|MessagesLarger|APartition|ARestarted)|^Multicast\.(EightSubscribers|BrokersSharingGroups)|^Via/Fragments\.(LargeMessages|AMessageLeftOpen)|^Faults/WorkerFaults\.AStuckWorker|^Via/Resilience\.(ASubscriptionTheBrokerRefused|PublishingWhileDisconnected)|^Via/Spec\.FramesRightAfterConnect|^Via/Polled\.ItSays|^Via/Spec\.(EveryBroken|ConnectRequestsOutOfRange)|^Health\.|^Via/Fragments\.EveryBroken|^Relay\.(AnSrqDepth|WrongFrames|BadHandshakes|MalformedFrame|FramesBeforeConnect|OversizedPublish|SendLarger|GivingBackCredits|ConnectionsThatNeverLogIn|Cli|CApi)|^Isolation\.SlowSubscribers'
ASAN_SKIP='^Via/(Auth\.CliExitCodes|HeadersTest\.CliPublishes|Routing\.Cli|Gossip\.)|^Relay\.(BusyPolling|AdaptivePolling|FanOutAcrossDevices)|^Multicast\.EightSubscribers|^Via/Cluster\.APartition'
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
  if grep -q '^RDMABROKER_SANITIZE:STRING=thread$' "$dir/CMakeCache.txt"; then
    jobs=${RDMABROKER_GUEST_JOBS_TSAN:-1}
    skip=${RDMABROKER_GUEST_TSAN_SKIP-$TSAN_SKIP}
  elif grep -q '^RDMABROKER_SANITIZE:STRING=address$' "$dir/CMakeCache.txt"; then
    skip=${RDMABROKER_GUEST_ASAN_SKIP-$ASAN_SKIP}
  fi
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$dir" -L rdma -j "$jobs" --output-on-failure --timeout 900 \
    ${RDMABROKER_GUEST_FILTER:+-R "$RDMABROKER_GUEST_FILTER"} ${skip:+-E "$skip"} 2>&1 | tee "$log" | awk '
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
