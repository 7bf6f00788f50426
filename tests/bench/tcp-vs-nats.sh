#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# rdmabroker over TCP against nats-server on this host's loopback, in the same
# minute (issue 16): 1 publisher -> 1 subscriber, 64 B; the rate flat out
# (RUNS alternating runs of COUNT messages each, median) and the latency at
# 1,000 msg/s (from the publish schedule, p50/p99, median of RUNS), with
# rdmabroker's wake-ups per message (bench --admin-socket).
# The table goes into docs/benchmarks.md's section tcp-vs-nats-RUNS-COUNT
# when it has one (doc_table, suite-lib.sh).
#   tests/bench/tcp-vs-nats.sh [RUNS] [COUNT]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
RUNS=${1:-3}
COUNT=${2:-1000000}
BIN=${RDMABROKER_BIN:-build/release}
command -v nats-server >/dev/null || { echo "tcp-vs-nats: nats-server is not installed" >&2; exit 1; }
[ -x "$BIN/tests/bench/drivers/nats_bench" ] || ninja -C "$BIN" rdmabrokerd rdmabroker_cli nats_bench >/dev/null
BASE=$((21000 + $$ % 4000))
RB_PORT=$BASE NATS_PORT=$((BASE + 1))
SOCK=/tmp/bench-tcp-nats-$$.sock
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -f "$SOCK"; }
trap cleanup EXIT
"$BIN/daemon/rdmabrokerd" --rdma off --tcp-port "$RB_PORT" --admin-socket "$SOCK" --metrics-listen "" \
  --workers 2 --allow-anonymous --buffer-size 32768 --log-level warn &
PIDS+=($!)
nats-server -a 127.0.0.1 -p "$NATS_PORT" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  [ -S "$SOCK" ] && (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null && break
  sleep 0.1
done
RB=("$BIN/client-lib/rdmabroker" bench -s "tcp://127.0.0.1:$RB_PORT" --admin-socket "$SOCK")
NATS=("$BIN/tests/bench/drivers/nats_bench" -s "nats://127.0.0.1:$NATS_PORT")
TMP=$(mktemp -d)
for i in $(seq "$RUNS"); do
  "${RB[@]}" --size 64 -n "$COUNT" --quiet --json >"$TMP/rb-rate-$i.json"
  "${NATS[@]}" --size 64 -n "$COUNT" --quiet --json >"$TMP/nats-rate-$i.json"
  "${RB[@]}" --size 64 -r 1000 -d 3 --quiet --json >"$TMP/rb-lat-$i.json"
  "${NATS[@]}" --size 64 -r 1000 -d 3 --quiet --json >"$TMP/nats-lat-$i.json"
done
python3 - "$TMP" "$RUNS" "$(nats-server --version)" <<'EOF' | doc_table "tcp-vs-nats-$RUNS-$COUNT"
import json, os, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def agg(name, i):
    return json.load(open(f"{d}/{name}-{i}.json"))["aggregate"]
def col(system):
    rates = [agg(f"{system}-rate", i)["delivery_msgs_per_s"] for i in range(1, runs + 1)]
    lat = [agg(f"{system}-lat", i)["latency_from_send"] for i in range(1, runs + 1)]
    wake = [agg(f"{system}-lat", i).get("wakeups_per_message", {}).get("total") for i in range(1, runs + 1)]
    wake = [w for w in wake if w is not None]
    return {"rate": statistics.median(rates), "rates": rates,
            "p50": statistics.median(l["p50_us"] for l in lat), "p99": statistics.median(l["p99_us"] for l in lat),
            "wake": statistics.median(wake) if wake else None}
rb, nats = col("rb"), col("nats")
print(f"{runs} runs of 1 → 1 at 64 B on this host's loopback ({sys.argv[3]}, {os.cpu_count()} cores)")
print()
fmt_rates = lambda c: " / ".join(f"{r / 1e6:.2f}" for r in c["rates"])
print("| 64 B, 1 → 1, loopback | rdmabroker (TCP) | NATS | ratio |")
print("|---|---:|---:|---:|")
print(f"| flat out, msg/s (median of {runs}; runs in M) | {rb['rate'] / 1e6:.2f}M ({fmt_rates(rb)}) "
      f"| {nats['rate'] / 1e6:.2f}M ({fmt_rates(nats)}) | **{rb['rate'] / nats['rate']:.2f}×** |")
print(f"| 1,000 msg/s: p50 µs | {rb['p50']:.0f} | {nats['p50']:.0f} | **{rb['p50'] / nats['p50']:.2f}×** |")
print(f"| 1,000 msg/s: p99 µs | {rb['p99']:.0f} | {nats['p99']:.0f} | {rb['p99'] / nats['p99']:.2f}× |")
w = "n/a" if rb["wake"] is None else f"{rb['wake']:.2f}"
print(f"| 1,000 msg/s: wake-ups per message (clients + broker) | {w} | | |")
EOF
rm -rf "$TMP"
