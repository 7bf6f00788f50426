#!/usr/bin/env bash
# First relay-rate measurement (the full benchmark suite arrives with the
# benchmarks work): 1 publisher -> 1 subscriber through rdmabrokerd over RDMA,
# N messages of SIZE bytes, timed from the first publish to the last delivery.
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/relay-rate.sh [COUNT] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-200000}
SIZE=${2:-64}
BIN=${RDMABROKER_BIN:-build/release}
if [ "${RDMABROKER_GUEST:-}" != 1 ] && ! ibv_devices 2>/dev/null | grep -q -e rxe -e mlx; then
  [ -x "$BIN/daemon/rdmabrokerd" ] || scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  exec tests/softroce/run-in-guest.sh env RDMABROKER_BIN="$BIN" tests/bench/relay-rate.sh "$COUNT" "$SIZE"
fi
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
"$BIN/daemon/rdmabrokerd" --port 7479 --admin-socket "$SOCK" --workers 2 --log-level warn &
B=$!
trap 'kill $B 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
MSG=$(head -c "$SIZE" /dev/zero | tr '\0' 'x')
"$BIN/client-lib/rdmabroker" sub bench.rate --raw --count "$COUNT" --timeout 600 -s "rdma://$A1:7479" -b "$A2" >/dev/null &
S=$!
for _ in $(seq 100); do
  "$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK" | grep -q '^subscriptions 1$' && break
  sleep 0.1
done
T0=$(date +%s.%N)
"$BIN/client-lib/rdmabroker" pub bench.rate "$MSG" -n "$COUNT" -s "rdma://$A1:7479"
wait $S
T1=$(date +%s.%N)
STATS=$("$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK")
get() { awk -v k="$1" '$1==k{print $2}' <<<"$STATS"; }
awk -v n="$COUNT" -v s="$SIZE" -v t0="$T0" -v t1="$T1" -v sends="$(get rdma.sends_posted)" -v frames="$(get rdma.frames_sent)" -v recv="$(get rdma.receives)" \
  -v raw="$RAW" 'BEGIN { t = t1 - t0; printf "relay-rate: %d x %d B, 1 -> 1 over RDMA: %.2f s, %.0f msg/s, %.1f MB/s; broker: %d receives, %d SENDs posted (%d frames)\n", n, s, t, n / t, n * s / t / 1e6, recv, sends, frames;
    if (raw != "n/a") printf "relay-rate: raw ib_send_bw %d B rxe1 -> rxe0 in the same run: %d msg/s; relay / raw = %.1f\n", s, raw, (n / t) / raw }'
