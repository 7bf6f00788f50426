#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# First relay-rate measurement (the full benchmark suite arrives with the
# benchmarks work): 1 publisher -> 1 subscriber through rdmabrokerd over RDMA,
# N messages of SIZE bytes, timed from the first publish to the last delivery;
# then the same over the broker's TCP transport (rxe1's address -> rxe0's, the
# guest kernel's TCP over the same veth), in the same run.
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/relay-rate.sh [COUNT] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-200000}
SIZE=${2:-64}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/relay-rate.sh "$COUNT" "$SIZE"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}

# Baseline in the same run: raw perftest SEND of the same size, rxe1 -> rxe0,
# one message per packet (what the relay's batching is measured against).
RAW=n/a
if command -v ib_send_bw >/dev/null; then
  ib_send_bw -d rxe0 -x 1 -s "$SIZE" -n 20000 -p 18515 >/tmp/perf-server.txt 2>&1 &
  PS=$!
  sleep 1
  ib_send_bw -d rxe1 -x 1 -s "$SIZE" -n 20000 -p 18515 "$A1" >/tmp/perf-client.txt 2>&1 || true
  wait $PS || true
  # columns: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
  RAW=$(awk -v s="$SIZE" '$1==s && NF>=5 {printf "%.0f", $5 * 1e6; exit}' /tmp/perf-client.txt)
  [ -n "$RAW" ] || RAW=n/a
fi
SOCK=/tmp/relay-rate.sock
"$BIN/daemon/rdmabrokerd" --port 7479 --tcp-port 7480 --admin-socket "$SOCK" --workers 2 --log-level warn --allow-anonymous &
B=$!
trap 'kill $B 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
MSG=$(head -c "$SIZE" /dev/zero | tr '\0' 'x')
CLI="$BIN/client-lib/rdmabroker"

# measure LABEL URL: one run of COUNT messages; prints the rate, sets RATE.
measure() {
  local label=$1 url=$2 before
  before=$("$CLI" stat --admin-socket "$SOCK" | awk '$1=="subscriptions"{print $2}')
  "$CLI" sub bench.rate --raw --count "$COUNT" --timeout 600 -s "$url" -b "$A2" >/dev/null &
  local s=$!
  for _ in $(seq 100); do
    "$CLI" stat --admin-socket "$SOCK" | grep -q "^subscriptions $((before + 1))$" && break
    sleep 0.1
  done
  local t0 t1
  t0=$(date +%s.%N)
  "$CLI" pub bench.rate "$MSG" -n "$COUNT" -s "$url" -b "$A2"
  wait $s
  t1=$(date +%s.%N)
  RATE=$(awk -v n="$COUNT" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.0f", n / (t1 - t0) }')
  awk -v n="$COUNT" -v s="$SIZE" -v t0="$t0" -v t1="$t1" -v l="$label" 'BEGIN { t = t1 - t0;
    printf "relay-rate: %d x %d B, 1 -> 1 over %s: %.2f s, %.0f msg/s, %.1f MB/s\n", n, s, l, t, n / t, n * s / t / 1e6 }'
}

measure RDMA "rdma://$A1:7479"
RDMA_RATE=$RATE
STATS=$("$CLI" stat --admin-socket "$SOCK")
get() { awk -v k="$1" '$1==k{print $2}' <<<"$STATS"; }
echo "relay-rate: broker over RDMA: $(get rdma.receives) receives, $(get rdma.sends_posted) SENDs posted ($(get rdma.frames_sent) frames)"
if [ "$RAW" != n/a ]; then
  awk -v s="$SIZE" -v raw="$RAW" -v r="$RDMA_RATE" 'BEGIN { printf "relay-rate: raw ib_send_bw %d B rxe1 -> rxe0 in the same run: %d msg/s; relay / raw = %.1f\n", s, raw, r / raw }'
fi
measure TCP "tcp://$A1:7480"
awk -v r="$RDMA_RATE" -v t="$RATE" 'BEGIN { printf "relay-rate: RDMA / TCP in the same run = %.2f\n", r / t }'
