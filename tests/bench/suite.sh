#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The benchmark suite: every comparison in one run, so that ratios hold on a
# noisy machine, written to docs/benchmarks.md (the section between the suite
# markers) and docs/img/*.png, with raw JSON and CSV in build/bench/<time>/.
#
#   sudo tests/bench/suite.sh [--quick]
#
#   1. installs what it needs (scripts/install-deps.sh --bench) and builds
#      the release tree with the NATS and Redis drivers;
#   2. in the Soft-RoCE guest (tests/bench/suite-guest.sh): raw perftest
#      (ib_send_bw, ib_send_lat, rdma_cm mode) on rxe1 -> rxe0, rdmabroker
#      over RDMA 1 -> 1 at 64 B, 1 KiB, 16 KiB and 1 MiB (rate, and latency at
#      a light fixed rate), fan-out 1 -> 1/4/16/32, 4 -> 4, and RSS per idle
#      RDMA connection at 1,000 connections;
#   3. on this host's loopback: rdmabroker's TCP transport, nats-server and
#      redis-server, each driven by the same measurement (`rdmabroker bench`,
#      tests/bench/drivers/nats_bench and redis_bench) with the same sizes,
#      counts and fan-outs, three runs each (the median is reported), the
#      micro-benchmarks (tests/bench/micro.sh), and RSS per idle TCP
#      connection at 1,000;
#   4. tests/bench/suite_report.py: results.json, results.csv, the tables with
#      the ratios (relay/raw, rdmabroker/NATS, rdmabroker/Redis) and the plots.
# --quick: a fiftieth of the counts, one run each, the shortest durations,
# over RDMA only 64 B, 16 KiB and 1 MiB (checks the machinery, measures
# nothing).
# Exit status 1 when a run failed or lost messages (the report says which).
set -euo pipefail
cd "$(dirname "$0")/../.."
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
BIN=${RDMABROKER_BIN:-build/release}
T0=$(date +%s)

scripts/install-deps.sh --bench
scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
OUT=${RDMABROKER_BENCH_OUT:-build/bench/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh

echo "=== suite: RDMA in the Soft-RoCE guest"
# The full run takes about 35 minutes in the guest on a slow day (the
# harness's default bound is 30).
RDMABROKER_GUEST_TIMEOUT=${RDMABROKER_GUEST_TIMEOUT:-5400} \
  tests/softroce/run-in-guest.sh tests/bench/suite-guest.sh "$BIN" "$OUT" "$QUICK"
record_deferred "$OUT"
SEQ_NO=$(ls "$OUT" | grep -c '^[0-9]' || true)

echo "=== suite: TCP on loopback: rdmabroker, NATS, Redis"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
BASE=$((20000 + $$ % 5000))
RB_PORT=$BASE NATS_PORT=$((BASE + 1)) REDIS_PORT=$((BASE + 2))
SOCK=/tmp/bench-suite-host-$$.sock
"$BIN/daemon/rdmabrokerd" --rdma off --tcp-port "$RB_PORT" --admin-socket "$SOCK" --metrics-listen "" --workers 2 --allow-anonymous \
  --buffer-size 32768 --log-level warn &
RB_PID=$!
PIDS+=("$RB_PID")
nats-server -a 127.0.0.1 -p "$NATS_PORT" >"$OUT/nats-server.log" 2>&1 &
NATS_PID=$!
PIDS+=("$NATS_PID")
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$OUT/redis-server.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 100); do
  [ -S "$SOCK" ] && (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null &&
    (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null && break
  sleep 0.1
done

# tcp_bench GROUP SIZE ARGS...: the same run on each system.
tcp_bench() {
  local group=$1 size=$2
  shift 2
  run_bench rdmabroker tcp "$group" "$size" "$RB_PID" "$BIN/client-lib/rdmabroker" bench -s "tcp://127.0.0.1:$RB_PORT" --size "$size" "$@"
  run_bench nats tcp "$group" "$size" "$NATS_PID" "$BIN/tests/bench/drivers/nats_bench" -s "nats://127.0.0.1:$NATS_PORT" --size "$size" "$@"
  run_bench redis tcp "$group" "$size" "$REDIS_PID" "$BIN/tests/bench/drivers/redis_bench" -s "redis://127.0.0.1:$REDIS_PORT" --size "$size" "$@"
}
REPEAT=$( [ "$QUICK" = 1 ] && echo 1 || echo 3 )
DIV=$( [ "$QUICK" = 1 ] && echo 50 || echo 1 )
LIGHT_TCP=1000
for _ in $(seq "$REPEAT"); do
  tcp_bench size 64 -n $((1000000 / DIV))
  tcp_bench size 1024 -n $((500000 / DIV))
  tcp_bench size 16384 -n $((100000 / DIV))
  for s in 64 1024 16384; do
    tcp_bench size "$s" -r "$LIGHT_TCP" -d $( [ "$QUICK" = 1 ] && echo 1 || echo 3 )
  done
  for m in 1 4 16 32; do
    tcp_bench fanout 64 -p 1 -m "$m" -n $((200000 / DIV))
  done
  tcp_bench 4x4 64 -p 4 -m 4 -n $((200000 / DIV))
done
cleanup
PIDS=()

echo "=== suite: micro-benchmarks (host)"
MICRO=()
[ "$QUICK" = 1 ] && MICRO=(--benchmark_min_time=0.01)
RDMABROKER_BIN=$BIN tests/bench/micro.sh --benchmark_format=json "${MICRO[@]}" >"$OUT/micro.json"

echo "=== suite: memory per idle TCP connection"
record_idle_rss tcp "$(RDMABROKER_BIN=$BIN tests/bench/idle-rss.sh tcp $( [ "$QUICK" = 1 ] && echo 50 || echo 1000 ))"

record_deferred "$OUT"

echo "=== suite: report"
CPU=$(awk -F: '/model name/ { sub(/^ +/, "", $2); print $2; exit }' /proc/cpuinfo)
ARGS=(--machine "$(nproc) cores ($CPU), Soft-RoCE guest under TCG with $(nproc) vCPUs"
      --light-rdma "200 msg/s (20 msg/s at 1 MiB)" --light-tcp "$LIGHT_TCP msg/s"
      --revision "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- . ':!docs' 2>/dev/null || echo ' with uncommitted changes')"
      --command "sudo tests/bench/suite.sh$( [ "$QUICK" = 1 ] && echo ' --quick' || true )")
if [ "$QUICK" = 0 ]; then
  ARGS+=(--docs docs/benchmarks.md --img docs/img)
fi
rc=0
python3 tests/bench/suite_report.py report "$OUT" "${ARGS[@]}" || rc=$?
echo "=== suite: $(( $(date +%s) - T0 )) s; records in $OUT$( [ "$QUICK" = 0 ] && echo '; docs/benchmarks.md and docs/img/ updated')"
exit $rc
