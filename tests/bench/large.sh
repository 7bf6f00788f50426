#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Large messages (proto/SPEC.md §3.7) on the broker's default 16 KiB buffers,
# limits.max_payload raised to 64 MiB:
#   host (TCP, loopback): rdmabroker against nats-server (max_payload 64 MB)
#     at 1 MiB and 16 MiB, 1 -> 1 flat out, alternating, median of 3;
#   guest (one Soft-RoCE boot): raw ib_send_bw rxe1 -> rxe0 at 16 KiB,
#     256 KiB, 1 MiB, 16 MiB and 64 MiB, then the relay 1 -> 1 at the same
#     sizes (bytes/s against raw), as fragments (--no-rendezvous) and by
#     rendezvous (SPEC.md §3.8, §3.9: the broker READs the first hop and
#     WRITEs the second into the subscriber's landing area), the time
#     one 64 MiB message takes from the
#     publish call to its delivery, and the memory: the broker's pinned
#     memory (VmPin: its pool, whatever max_payload is) and peak RSS, and a
#     client's pinned memory; and where the time goes at 1 MiB: the first
#     hop alone (a publisher, no subscriber), the CPU the broker and the
#     clients used per message; then the relay again with 256 KiB frames
#     (buffers.size 256 KiB, pool 512: the same pinned memory) and clients
#     whose receive buffers match, and with 16 KiB client buffers (the
#     broker cuts what it sends them, SPEC.md §3.7).
#   tests/bench/large.sh            (both parts)
#   tests/bench/large.sh tcp|rdma   (one)
# Each part's list goes into docs/benchmarks.md's section large-tcp or
# large-rdma (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
PART=${1:-both}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
CLI="$BIN/client-lib/rdmabroker"
CONFIG=/tmp/large-$$.yaml
printf 'limits:\n  max_payload: 64MiB\n' >"$CONFIG"
# bench URL SIZE COUNT [ARGS]: one 1 -> 1 run; prints "MB/s p50_us"
bench() {
  "$1" bench -s "$2" --size "$3" -n "$4" "${@:5}" --json --quiet |
    python3 -c 'import json,sys; a=json.load(sys.stdin)["aggregate"]; print("%.1f %.0f" % (a["delivery_mb_per_s"], a["latency"]["p50_us"]))'
}
median() { sort -n | sed -n 2p; }

if [ "$PART" = both ] || [ "$PART" = tcp ]; then
  NATS_CONF=/tmp/large-nats-$$.conf
  printf 'max_payload: 67108864\nmax_pending: 268435456\n' >"$NATS_CONF"
  PORT=$((21000 + $$ % 4000))
  SOCK=/tmp/large-host-$$.sock
  start_broker --rdma off --tcp-port "$PORT" --config "$CONFIG"
  nats-server -a 127.0.0.1 -p $((PORT + 1)) -c "$NATS_CONF" >/tmp/large-nats.log 2>&1 &
  NATS=$!
  trap 'kill $NATS 2>/dev/null; stop_broker' EXIT
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((PORT + 1))") 2>/dev/null && break; sleep 0.1; done
  {
    echo "TCP on this host's loopback, $(nats-server --version) with max_payload 64 MiB, 1 → 1 flat out," \
      "alternating, median of 3"
    echo
    echo "| size | rdmabroker TCP (runs) | nats-server (runs) | ours / NATS |"
    echo "|---|---:|---:|---:|"
    for s in 1048576 16777216; do
      n=$((s > 2000000 ? 40 : 500))
      for _ in 1 2 3; do
        echo "rb $(bench "$CLI" "tcp://127.0.0.1:$PORT" "$s" "$n")"
        echo "nats $(bench "$BIN/tests/bench/drivers/nats_bench" "nats://127.0.0.1:$((PORT + 1))" "$s" "$n")"
      done >/tmp/large-tcp-$s.txt
      RB=$(awk '$1=="rb"{print $2}' /tmp/large-tcp-$s.txt | median)
      NATS_MB=$(awk '$1=="nats"{print $2}' /tmp/large-tcp-$s.txt | median)
      runs() { awk -v k="$1" '$1==k{print $2}' /tmp/large-tcp-$s.txt | paste -sd/ | sed 's|/| / |g'; }
      echo "| $((s / 1048576)) MiB | $RB MB/s ($(runs rb)) | $NATS_MB MB/s ($(runs nats)) |" \
        "**$(awk -v a="$RB" -v b="$NATS_MB" 'BEGIN{printf "%.2f", a/b}')** |"
    done
  } | doc_table large-tcp
  kill "$NATS" 2>/dev/null || true
  stop_broker
  trap - EXIT
fi
[ "$PART" = both ] || [ "$PART" = rdma ] || exit 0
host_build raw_relay
in_guest_unless_rdma "$0" rdma

A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
SIZES=(16384 262144 1048576 16777216 67108864)
count_for() { case $1 in 16384) echo 4000 ;; 262144) echo 400 ;; 1048576) echo 100 ;; 16777216) echo 8 ;; *) echo 3 ;; esac; }
ratio() { awk -v a="$1" -v b="${2:-0}" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "n/a" }'; }
# relay_runs URL SIZE ARGS...: three runs' MB/s, one per line.
relay_runs() { for _ in 1 2 3; do bench "$CLI" "$1" "$2" "$(count_for "$2")" -b "$A2" "${@:3}" | cut -d' ' -f1; done; }
declare -A RAW FLOOR RUNSFLOOR R16 RUNS16 RRDV RUNSRDV R256 RUNS256
# raw_relay_bulk SIZE COUNT KEY: the raw relay's figure KEY (mb_per_s or seconds).
raw_relay_bulk() {
  RDMABROKER_GUEST=1 tests/bench/raw-relay.sh bulk "$1" "$2" 2>/dev/null | awk -v k="$3" '$1 == k { print $2 }'
}
ROWS=()  # "what|result" rows of the second table
for s in "${SIZES[@]}"; do
  iters=$(count_for "$s")
  [ "$iters" -ge 5 ] || iters=5  # perftest's floor
  run_perftest 600 /tmp/large-perf.txt ib_send_bw -s "$s" -n "$iters" || true
  # columns: #bytes #iterations BW-peak BW-average[MB/s] MsgRate
  RAW[$s]=$(awk -v s="$s" '$1==s && NF>=5 {print $4; exit}' /tmp/large-perf.txt)
  echo "large: raw ib_send_bw $s B: ${RAW[$s]:-n/a} MB/s" >&2
done
# Two brokers side by side, so that every way a size travels is measured in
# the same rounds: on 7492 the defaults' 16 KiB buffers; on 7493 fewer,
# larger SENDs: 256 KiB frames in the same pinned memory (512 x 256 KiB =
# 8192 x 16 KiB), the SRQ as deep in bytes (64 x 256 KiB).
printf 'limits:\n  max_payload: 64MiB\nbuffers:\n  size: 256KiB\n  pool: 512\n  srq_depth: 64\n' >"$CONFIG.256k"
SOCK=/tmp/large-256k-$$.sock
start_broker --port 7493 --config "$CONFIG.256k"
BROKER256=$BROKER SOCK256=$SOCK
SOCK=/tmp/large-$$.sock
start_broker --port 7492 --config "$CONFIG"
trap 'stop_broker; kill "$BROKER256" 2>/dev/null; rm -f "$SOCK256"' EXIT
URL=rdma://$A1:7492
URL256=rdma://$A1:7493
vm() { awk -v k="$2:" '$1==k{print $2}' "/proc/$1/status"; }
PIN0=$(vm "$BROKER" VmPin)
# Three rounds, each size once each way in every round (the guest's pace
# drifts within a boot: alternating keeps it out of the ratios): the raw
# relay, the floor of a relay on this device (raw verbs publisher -> relay
# -> subscriber, each message one SEND per hop forwarded from where it
# landed, tests/bench/raw-relay.sh bulk); 16 KiB frames; rendezvous; 256
# KiB frames (from 256 KiB).
rm -f /tmp/large-rounds.txt
for round in 1 2 3; do
  for s in "${SIZES[@]}"; do
    n=$(count_for "$s")
    echo "$s floor $(raw_relay_bulk "$s" "$n" mb_per_s)"
    echo "$s frames16 $(bench "$CLI" "$URL" "$s" "$n" -b "$A2" --no-rendezvous | cut -d' ' -f1)"
    echo "$s rendezvous $(bench "$CLI" "$URL" "$s" "$n" -b "$A2" | cut -d' ' -f1)"
    [ "$s" -lt 262144 ] || echo "$s frames256 $(bench "$CLI" "$URL256" "$s" "$n" -b "$A2" \
      --recv-buffer-size 262144 --recv-credits 16 --no-rendezvous | cut -d' ' -f1)"
  done | tee -a /tmp/large-rounds.txt | sed "s/^/large: round $round: /" >&2
done
# runs_of SIZE WAY: the rounds' MB/s, in order; median_of SIZE WAY: their median.
runs_of() { awk -v s="$1" -v w="$2" '$1 == s && $2 == w { print $3 }' /tmp/large-rounds.txt; }
median_of() { runs_of "$1" "$2" | sort -n | sed -n 2p; }
listed() { runs_of "$1" "$2" | paste -sd/ | sed 's|/| / |g'; }
for s in "${SIZES[@]}"; do
  FLOOR[$s]=$(median_of "$s" floor) RUNSFLOOR[$s]=$(listed "$s" floor)
  R16[$s]=$(median_of "$s" frames16) RUNS16[$s]=$(listed "$s" frames16)
  RRDV[$s]=$(median_of "$s" rendezvous) RUNSRDV[$s]=$(listed "$s" rendezvous)
  if [ "$s" -ge 262144 ]; then R256[$s]=$(median_of "$s" frames256) RUNS256[$s]=$(listed "$s" frames256); fi
done
rm -f /tmp/large-rounds.txt
ONE=$(for _ in 1 2 3; do raw_relay_bulk 67108864 1 seconds; done | median)
ROWS+=("one 64 MiB message through the raw relay (the floor), the publisher's start to delivery (median of 3)|$ONE s")
# What a large message costs besides the device: a pass over memory the
# process has not touched yet (page faults and the kernel's zeroing, then
# the writes) is what the library's copy of an offered message and the
# zeroed Message::payload a landing area is are, each, at 64 MiB (glibc
# maps each such block afresh).
FRESH=$(for _ in 1 2 3; do
  python3 -c 'import time; t = time.perf_counter(); b = b"\x01" * (64 << 20); print("%.3f" % (time.perf_counter() - t))'
done | median)
ROWS+=("writing 64 MiB of memory not touched before, once (median of 3): the publisher's copy of a 64 MiB message, and again the subscriber's zeroed landing area|$FRESH s")
# Where the time goes at 1 MiB: the first hop alone (nobody subscribes:
# the broker takes every fragment and forwards none), then the 1 -> 1 run
# again with the CPU the broker and the bench process used.
hop() {
  "$CLI" bench -s "$URL" -b "$A2" --size 1048576 -n 100 -m 0 --json --quiet "$@" |
    python3 -c 'import json,sys; a=json.load(sys.stdin)["aggregate"]; print("%.1f" % (a["publish_msgs_per_s"] * 1048576 / 1e6))'
}
HOP=$(hop --no-rendezvous)
ROWS+=("1 MiB, the first hop alone (publisher → broker, no subscriber; 16 KiB frames)|$HOP MB/s, $(ratio "$HOP" "${RAW[1048576]}")× raw")
HOP=$(hop)
ROWS+=("1 MiB, the first hop alone by rendezvous (the broker READs; 16 KiB pool buffers)|$HOP MB/s, $(ratio "$HOP" "${RAW[1048576]}")× raw")
b0=$(cpu_ticks "$BROKER")
t0=$(date +%s.%N)
/usr/bin/time -f "%U %S" -o /tmp/large-time.txt "$CLI" bench -s "$URL" -b "$A2" --size 1048576 -n 100 --json --quiet --no-rendezvous >/tmp/large-1m.json
t1=$(date +%s.%N)
b1=$(cpu_ticks "$BROKER")
ROWS+=("$(awk -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" -v c="$(awk '{print $1 + $2}' /tmp/large-time.txt)" 'BEGIN {
  w = t1 - t0; printf "1 MiB 1 → 1 (16 KiB frames), 100 MiB in %.1f s|broker %.0f%% of a vCPU, bench process (publisher and subscriber) %.0f%%; the rest of the 2 vCPUs is rxe in the kernel",
  w, 100 * (b1 - b0) / hz / w, 100 * c / w }')")
ONE=$(for _ in 1 2 3; do bench "$CLI" "$URL" 67108864 1 -b "$A2" --no-rendezvous | cut -d' ' -f2; done | median)
ROWS+=("one 64 MiB message (16 KiB frames), publish call to delivery (median of 3)|$(awk -v u="$ONE" 'BEGIN{printf "%.2f", u/1e6}') s")
ONE=$(for _ in 1 2 3; do bench "$CLI" "$URL" 67108864 1 -b "$A2" | cut -d' ' -f2; done | median)
ROWS+=("one 64 MiB message by rendezvous, publish call to delivery (median of 3)|$(awk -v u="$ONE" 'BEGIN{printf "%.2f", u/1e6}') s")
# A client's pinned memory: a subscriber connected to this broker (max_payload 64 MiB).
"$CLI" sub large.idle -s "$URL" -b "$A2" >/dev/null &
SUB=$!
for _ in $(seq 100); do [ "$(vm $SUB VmPin)" != "" ] && [ "$(vm $SUB VmPin)" != 0 ] && break; sleep 0.1; done
sleep 0.5
ROWS+=("a client's pinned memory (VmPin; 16 KiB buffers, defaults)|$(vm $SUB VmPin) KiB, whatever \`max_payload\`")
ROWS+=("the broker's pinned memory (VmPin), 16 KiB frames|$PIN0 KiB at start, $(vm "$BROKER" VmPin) KiB after the runs")
ROWS+=("the broker's peak RSS (VmHWM)|$(vm "$BROKER" VmHWM) KiB")
kill $SUB 2>/dev/null || true
runs=$(relay_runs "$URL256" 1048576 --no-rendezvous)
MB=$(median <<<"$runs")
ROWS+=("1 MiB, 256 KiB frames at the broker and the publisher, the subscriber on 16 KiB receive buffers (the broker cuts what it sends it, SPEC.md §3.7)|$MB MB/s ($(paste -sd/ <<<"$runs" | sed 's|/| / |g')): $(ratio "$MB" "${RAW[1048576]}")× raw")
ROWS+=("the broker's pinned memory (VmPin), 256 KiB frames|$(vm "$BROKER256" VmPin) KiB")
stop_broker
kill "$BROKER256" 2>/dev/null && wait "$BROKER256" 2>/dev/null || true
rm -f "$SOCK256" "$CONFIG.256k"
trap - EXIT
{
  echo "1 → 1 flat out, raw \`ib_send_bw\` rxe1 → rxe0 and, each the median of 3 rounds that run every way once," \
    "the raw relay (\`tests/bench/raw-relay.sh bulk\`) and the relays, in the same boot ($(uname -r))"
  echo
  echo "| size | raw \`ib_send_bw\` | raw relay (runs) | / raw | relay, 16 KiB frames (runs) | / raw | relay, rendezvous (runs) | / raw | / raw relay | relay, 256 KiB frames (runs) | / raw |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for s in "${SIZES[@]}"; do
    label=$(awk -v s="$s" 'BEGIN{ if (s >= 1048576) printf "%d MiB", s/1048576; else printf "%d KiB", s/1024 }')
    big="| |"
    [ -n "${R256[$s]:-}" ] && big="${R256[$s]} MB/s (${RUNS256[$s]}) | $(ratio "${R256[$s]}" "${RAW[$s]}") |"
    echo "| $label | ${RAW[$s]:-n/a} MB/s | ${FLOOR[$s]:-n/a} MB/s (${RUNSFLOOR[$s]}) | $(ratio "${FLOOR[$s]:-0}" "${RAW[$s]}") |" \
      "${R16[$s]} MB/s (${RUNS16[$s]}) | $(ratio "${R16[$s]}" "${RAW[$s]}") |" \
      "${RRDV[$s]} MB/s (${RUNSRDV[$s]}) | $(ratio "${RRDV[$s]}" "${RAW[$s]}") | $(ratio "${RRDV[$s]}" "${FLOOR[$s]:-0}") | $big"
  done
  echo
  echo "| what (same boot) | result |"
  echo "|---|---|"
  for row in "${ROWS[@]}"; do echo "| ${row%%|*} | ${row#*|} |"; done
} | doc_table large-rdma
rm -f "$CONFIG"
