#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The latency budget (issue 16): where a relayed message's microseconds go.
# 1 publisher -> 1 subscriber, 64 B, at a light fixed rate, `rdmabroker bench
# --trace` in each mode of latency-load.sh (a broker each), over RDMA and,
# for comparison, the default mode over TCP; raw ib_send_lat at 64 B (polled
# and -e) in the same boot. Each message's time is split by the publisher's
# and the subscriber's own clock readings and the relay time the broker puts
# in its DELIVER (proto/SPEC.md §3.4):
#   schedule -> publish call -> return -> subscriber's client -> handler
# with the broker's share and "both hops" (devices, wire, every wake-up on
# the way) inside "return -> subscriber's client". Writes a markdown table
# (p50 and p99 per stage and mode) to stdout and the reports to
# build/latency-budget-<mode>.json. In the same boot, the raw relay floor
# (tests/bench/raw-relay.sh: publisher -> relay -> subscriber on raw verbs,
# the same schedule) in events and polled mode, and each mode's
# `publish call -> handler` p50 against its floor (issue 47: at most 1.5x).
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/latency-budget.sh [SECONDS] [RATE]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-5}
RATE=${2:-200}
BIN=${RDMABROKER_BIN:-build/release}
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/latency-budget.sh "$SECS" "$RATE"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
SOCK=/tmp/bench-latency-budget.sock
CLI="$BIN/client-lib/rdmabroker"

# run NAME URL_SCHEME BROKER_FLAGS -- BENCH_FLAGS: one traced run, its report in build/.
run() {
  local name=$1 scheme=$2
  shift 2
  local broker=()
  while [ "$1" != -- ]; do broker+=("$1"); shift; done
  shift
  start_broker --port 7494 --tcp-port 7495 "${broker[@]}"
  local port=7494
  [ "$scheme" = tcp ] && port=7495
  "$CLI" bench w.budget -s "$scheme://$A1:$port" -b "$A2" --size 64 -r "$RATE" -d "$SECS" --quiet --json \
    --trace --admin-socket "$SOCK" "$@" >"build/latency-budget-$name.json" || true
  stop_broker
}

run default rdma --
run adaptive rdma --adaptive-poll true -- --adaptive-poll
run polled rdma --workers 1 --busy-poll-us 10000 -- --polled
run tcp tcp --
RAW_POLLED=$(raw_lat)
RAW_EVENTS=$(raw_lat -e)
# floor MODE: "p50 p99" of the raw relay's post call -> completion, µs.
floor() {
  tests/bench/raw-relay.sh "$1" "$RATE" "$SECS" 2>/dev/null |
    awk '$1 == "p50_us" { p50 = $2 } $1 == "p99_us" { p99 = $2 } END { print p50, p99 }'
}
FLOOR_EVENTS=$(floor events)
FLOOR_POLLED=$(floor polled)

python3 - "$SECS" "$RATE" "$RAW_POLLED" "$RAW_EVENTS" "$(uname -r)" "$FLOOR_EVENTS" "$FLOOR_POLLED" <<'EOF' |
import json, sys
secs, rate, raw_polled, raw_events, kernel, floor_events, floor_polled = sys.argv[1:8]
modes = [("default", "default (RDMA)"), ("adaptive", "adaptive (RDMA)"),
         ("polled", "fully polled (RDMA)"), ("tcp", "default (TCP)")]
reports = {}
for key, _ in modes:
    try:
        reports[key] = json.load(open(f"build/latency-budget-{key}.json"))["aggregate"]
    except (OSError, ValueError, KeyError):
        reports[key] = None
print(f"64 B, 1 -> 1, {rate} msg/s for {secs} s per mode ({kernel}); µs, p50 / p99 of each stage "
      "(percentiles of each stage over the same messages: they do not add up)")
print()
print("| stage | " + " | ".join(label for _, label in modes) + " |")
print("|---|" + "---:|" * len(modes))
stages = None
for r in reports.values():
    if r and "latency_budget" in r:
        stages = [(s["key"], s["stage"].strip()) for s in r["latency_budget"]["stages"]]
        break
def cell(r, key):
    if not r or "latency_budget" not in r:
        return "no report"
    for s in r["latency_budget"]["stages"]:
        if s["key"] == key:
            l = s["latency"]
            return "not known" if l is None else f"{l['p50_us']:,.1f} / {l['p99_us']:,.0f}"
    return "-"
for key, label in stages or []:
    print(f"| {label} | " + " | ".join(cell(reports[m], key) for m, _ in modes) + " |")
def wakeups(r):
    w = r and r["wakeups_per_message"]["total"]
    return "n/a" if w is None else f"{w:.2f}"
print("| wake-ups per delivered message | " + " | ".join(wakeups(reports[m]) for m, _ in modes) + " |")
print("| messages traced (lost) | " + " | ".join(
    "-" if not reports[m] else f"{reports[m]['latency_budget']['messages']:,} ({reports[m]['lost']})"
    for m, _ in modes) + " |")
# The floor each mode is held to: the raw relay sleeping on events for the
# default and adaptive modes, spinning for the fully polled one.
floors = {"default": floor_events.split(), "adaptive": floor_events.split(), "polled": floor_polled.split(),
          "tcp": None}
def floor_cell(m):
    f = floors[m]
    return "-" if not f or len(f) < 2 else f"{float(f[0]):,.1f} / {float(f[1]):,.0f}"
def total_p50(r):
    for s in (r or {}).get("latency_budget", {}).get("stages", []):
        if s["key"] == "total" and s["latency"]:
            return s["latency"]["p50_us"]
    return None
def verdict(m):
    f, t = floors[m], total_p50(reports[m])
    if not f or len(f) < 2 or t is None or float(f[0]) <= 0:
        return "-"
    x = t / float(f[0])
    return f"**{x:.2f}×** ({'met' if x <= 1.5 else 'missed'})"
print("| raw relay floor, same schedule: post call -> subscriber's completion | "
      + " | ".join(floor_cell(m) for m, _ in modes) + " |")
print("| publish call -> handler ÷ the floor, p50 (target ≤ 1.5×) | "
      + " | ".join(verdict(m) for m, _ in modes) + " |")
print()
print(f"raw ib_send_lat 64 B, typical one-way µs: polled {raw_polled}, with events (-e) {raw_events}")
EOF
  doc_table "latency-budget-$SECS-$RATE"
