#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Latency against offered load (issue 16): 1 publisher -> 1 subscriber, 64 B
# over RDMA, at fixed rates from light load towards saturation, latency from
# the publish schedule (corrected for coordinated omission: a message that
# waits behind a late one counts its wait), p50/p90/p99/p99.9, in three modes
# with a broker each:
#   default        two workers, clients with I/O threads
#   adaptive       the same with adaptive waiting in the broker
#                  (--adaptive-poll true) and the clients (bench --adaptive-poll)
#   fully polled   polled clients (bench --polled) and one worker that spins
#                  (--busy-poll-us 10000)
# and, in the same boot, raw ib_send_lat at 64 B (polled and -e) for scale.
# Writes a markdown table (also into docs/benchmarks.md's section
# latency-load-SECONDS for the default rates: doc_table, suite-lib.sh), the
# rows to $OUT (CSV) and a plot of p50 and p99 against the rate to
# docs/img/latency-load.png (gnuplot).
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/latency-load.sh [SECONDS] [RATES...]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-3}
shift || true
RATES=("$@")
NAME="latency-load-$SECS${RATES[*]:+-${RATES[*]// /-}}"
[ ${#RATES[@]} -gt 0 ] || RATES=(200 1000 3000 10000 30000)
BIN=${RDMABROKER_BIN:-build/release}
OUT=${OUT:-build/latency-load.csv}
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/latency-load.sh "$SECS" "${RATES[@]}"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
SOCK=/tmp/bench-latency-load.sock
CLI="$BIN/client-lib/rdmabroker"

echo "mode,rate,published,lost,msgs_per_s,p50_us,p90_us,p99_us,p99_9_us,wakeups_per_msg" >"$OUT"
# run LABEL RATE BROKER_FLAGS -- BENCH_FLAGS: one measurement, one row.
run() {
  local label=$1 rate=$2
  shift 2
  local broker=()
  while [ "$1" != -- ]; do broker+=("$1"); shift; done
  shift
  start_broker --port 7493 "${broker[@]}"
  "$CLI" bench w.load -s "rdma://$A1:7493" -b "$A2" --size 64 -r "$rate" -d "$SECS" --quiet --json \
    --admin-socket "$SOCK" "$@" >/tmp/bench-load.json || true
  stop_broker
  python3 - "$label" "$rate" /tmp/bench-load.json "$OUT" <<'EOF'
import json, sys
label, rate, path, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    a = json.load(open(path))["aggregate"]
except (ValueError, KeyError):
    print(f"| {label} | {rate:,} | no report | | | | | | | |")
    sys.exit(0)
f = a["latency_from_send"]
w = a["wakeups_per_message"]["total"]
wf = "n/a" if w is None else f"{w:.2f}"
print(f"| {label} | {rate:,} | {a['published']:,} | {a['lost']:,} | {a['delivery_msgs_per_s']:,.0f} "
      f"| {f['p50_us']:.0f} | {f['p90_us']:.0f} | {f['p99_us']:.0f} | {f['p99_9_us']:.0f} | {wf} |")
with open(out, "a") as o:
    o.write(f"{label},{rate},{a['published']},{a['lost']},{a['delivery_msgs_per_s']:.0f},{f['p50_us']:.1f},"
            f"{f['p90_us']:.1f},"
            f"{f['p99_us']:.1f},{f['p99_9_us']:.1f},{'' if w is None else f'{w:.3f}'}\n")
EOF
}

{
  echo "64 B, 1 → 1 over RDMA, $SECS s per point ($(uname -r)); latency µs from the publish schedule"
  echo
  echo "| mode | offered msg/s | published | lost | delivered msg/s | p50 | p90 | p99 | p99.9 | wake-ups/msg |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for rate in "${RATES[@]}"; do run default "$rate" --; done
  for rate in "${RATES[@]}"; do run adaptive "$rate" --adaptive-poll true -- --adaptive-poll; done
  for rate in "${RATES[@]}"; do run "fully polled" "$rate" --workers 1 --busy-poll-us 10000 -- --polled; done

  RAW_POLLED=$(raw_lat)
  RAW_EVENTS=$(raw_lat -e)
  echo
  echo "raw ib_send_lat 64 B, typical one-way µs: polled $RAW_POLLED, with events (-e) $RAW_EVENTS"

  gnuplot <<EOF
set terminal pngcairo noenhanced size 1000,500
set output "docs/img/latency-load.png"
set datafile separator ","
set logscale xy
set xlabel "offered rate, msg/s (1 -> 1, 64 B)"
set ylabel "latency from the publish schedule, µs"
set key outside right top
set grid
rows(m) = "< awk -F, -v m=".m." 'NR > 1 { k = \$1; gsub(/ /, \"_\", k); if (k == m) print }' $OUT"
plot for [m in "default adaptive fully_polled"] rows(m) using 2:6 with linespoints title m." p50", \
  for [m in "default adaptive fully_polled"] rows(m) using 2:8 with linespoints dashtype 2 title m." p99", \
  ${RAW_POLLED:-1/0} with lines dashtype 3 title "raw ib_send_lat polled", \
  ${RAW_EVENTS:-1/0} with lines dashtype 4 title "raw ib_send_lat -e"
EOF
} | doc_table "$NAME"
echo "plot: docs/img/latency-load.png; rows: $OUT"
