#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Wake-ups per delivered message (issue 16's bar: at most 2 end to end in the
# default mode at light load, 0 fully polled): a blocking wait that returns is
# the unit cost of latency on an idle core, and unlike a latency it does not
# depend on the machine's noise. 1 publisher -> 1 subscriber, 64 B at a light
# fixed rate, through rdmabrokerd over RDMA; `rdmabroker bench --admin-socket`
# counts the clients' wake-ups (ClientStats::io_wakeups + app_wakeups) and the
# broker's (`wakeups.*` in stat) over the measurement, with the latency, for:
#   default    two workers (publisher and subscriber on different workers),
#              and the same with adaptive waiting (broker and clients)
#   1 worker   --workers 1 (no hand-off between workers)
#   spinning   --workers 1, the worker busy-polls (--busy-poll-us) and both
#              clients' I/O threads too (bench --busy-poll-us), 1 ms and 10 ms
#   polled     polled clients (bench --polled: the subscriber's thread spins
#              on poll(0), the publisher polls after each publish), 1 worker;
#              and fully polled: the worker spins too (10 ms)
# and, in the same boot, raw ib_send_lat at 64 B (polled, and -e: events),
# the references for the latencies.
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/wakeups.sh [RATE] [SECONDS]
# The table goes into docs/benchmarks.md too (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-200}
SECS=${2:-5}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/wakeups.sh "$RATE" "$SECS"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
SOCK=/tmp/bench-wakeups.sock
CLI="$BIN/client-lib/rdmabroker"

# run LABEL BROKER_FLAGS -- BENCH_FLAGS: one measurement, one table row.
run() {
  local label=$1
  shift
  local broker=()
  while [ "$1" != -- ]; do broker+=("$1"); shift; done
  shift
  start_broker --port 7492 "${broker[@]}"
  "$CLI" bench w.lat -s "rdma://$A1:7492" -b "$A2" --size 64 -r "$RATE" -d "$SECS" --quiet --json \
    --admin-socket "$SOCK" "$@" >/tmp/bench-wakeups.json
  stop_broker
  python3 - "$label" /tmp/bench-wakeups.json <<'EOF'
import json, sys
label, path = sys.argv[1], sys.argv[2]
a = json.load(open(path))["aggregate"]
w = a["wakeups_per_message"]
f = a["latency_from_send"]
fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
print(f"| {label} | {a['received']:,} | {fmt(w['clients'])} | {fmt(w['broker'])} | {fmt(w['total'])} "
      f"| {f['p50_us']:.0f} | {f['p99_us']:.0f} |")
EOF
}

{
  echo "64 B, 1 -> 1 at $RATE msg/s for $SECS s over RDMA ($(uname -r))"
  echo
  echo "| mode | messages | wake-ups/msg: clients | broker | total | p50 µs (from publish) | p99 µs |"
  echo "|---|---|---|---|---|---|---|"
  run "default (2 workers)" --
  # Adaptive waiting spins only when recent sleeps were short (not at 200 msg/s).
  run "default, adaptive waiting (broker and clients)" --adaptive-poll true -- --adaptive-poll
  run "1 worker" --workers 1 --
  # Spinning only helps when the spin outlasts the gap between messages (5 ms
  # at 200 msg/s): 1 ms does not, 10 ms does.
  run "1 worker, all spin 1 ms" --workers 1 --busy-poll-us 1000 -- --busy-poll-us 1000
  run "1 worker, all spin 10 ms" --workers 1 --busy-poll-us 10000 -- --busy-poll-us 10000
  # Two spinning threads at most (the subscriber's and the worker's) on the
  # guest's two vCPUs; the publisher sleeps between publishes.
  run "polled clients, 1 worker" --workers 1 -- --polled
  run "fully polled: polled clients, 1 worker spins 10 ms" --workers 1 --busy-poll-us 10000 -- --polled

  echo
  echo "raw ib_send_lat 64 B, typical one-way µs: polled $(raw_lat), with events (-e) $(raw_lat -e)"
} | doc_table "wakeups-$RATE-$SECS"
