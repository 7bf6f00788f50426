#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Streams (issue 46), measured by tests/bench/drivers/stream_bench.
#
#   tests/bench/streams.sh tcp [RUNS]   rdmabroker against NATS JetStream on this
#       host's loopback, in the same minute: durable publish with acknowledgements
#       (64 B and 1 KiB, 200,000 each, 256 unanswered at most), the acknowledgement
#       latency (2,000 one after the other, p50/p99), and the replay of 1,000,000
#       stored messages of 64 B to one new consumer without acknowledgements; the
#       median of RUNS (default 3) alternating runs. Both store on this host's disk
#       with the same policy: JetStream 2.9 acknowledges once written and syncs
#       every two minutes; rdmabroker runs with `sync: interval` (the same) and,
#       for the record, `sync: group` (acknowledged after fdatasync).
#   tests/bench/streams.sh rdma [RUNS]  over RDMA, in the Soft-RoCE guest where there
#       is no RDMA device (the guest's stream directory is its tmpfs): durable publish
#       with group commit (256 unanswered, and flat out: the library's limit of 512)
#       against the plain relay rate of `rdmabroker bench` (flat out too), and the
#       replay of 200,000 messages against the live delivery rate, same boot; the
#       median of RUNS (default 5: single runs of one boot spread by 1.7x) rounds.
# The tables go into docs/benchmarks.md's sections streams-tcp-RUNS and streams-rdma.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
MODE=${1:?usage: streams.sh tcp [RUNS] | rdma [RUNS]}
BIN=${RDMABROKER_BIN:-build/release}
SB=$BIN/tests/bench/drivers/stream_bench
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

# broker NAME SYNC PORT [RDMA_ADDR]: a broker with stream BENCH (bench.>) under $DATA/NAME.
broker() {
  local name=$1 sync=$2 port=$3 addr=${4:-}
  mkdir -p "$DATA/$name"
  cat >"$TMP/$name.yaml" <<EOF
rdma: $([ -n "$addr" ] && echo on || echo off)
listen:
$([ -n "$addr" ] && echo "  rdma: $addr:$port" || echo "  tcp: 127.0.0.1:$port")
admin: {socket: $TMP/$name.sock}
metrics: {listen: ""}
auth: {anonymous: true}
logging: {level: warn}
workers: 2
storage: {directory: $DATA/$name, sync: $sync, sync_interval_ms: 10}
streams: [{name: BENCH, subjects: [bench.>]}]
EOF
  "$BIN/daemon/rdmabrokerd" --config "$TMP/$name.yaml" &
  PIDS+=($!)
  for _ in $(seq 100); do [ -S "$TMP/$name.sock" ] && return 0; sleep 0.1; done
  echo "streams: broker $name did not start" >&2
  exit 1
}
purge() { "$BIN/client-lib/rdmabroker" stream purge BENCH --admin-socket "$TMP/$1.sock" >/dev/null; }

if [ "$MODE" = tcp ]; then
  RUNS=${2:-3}
  command -v nats-server >/dev/null || { echo "streams: nats-server is not installed" >&2; exit 1; }
  ninja -C "$BIN" rdmabrokerd rdmabroker_cli stream_bench >/dev/null
  DATA=$(mktemp -d -p "$PWD/build" streams-bench.XXXX)  # on the disk, not a tmpfs
  trap 'cleanup; rm -rf "$DATA"' EXIT
  BASE=$((23000 + $$ % 4000))
  broker interval interval "$BASE"
  broker group group $((BASE + 1))
  nats-server -js -sd "$DATA/jetstream" -a 127.0.0.1 -p $((BASE + 2)) >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((BASE + 2))") 2>/dev/null && break; sleep 0.1; done
  declare -A URL=([interval]="tcp://127.0.0.1:$BASE" [group]="tcp://127.0.0.1:$((BASE + 1))"
                  [jetstream]="nats://127.0.0.1:$((BASE + 2))")
  run() {  # SYSTEM WHAT SIZE COUNT RUN
    local sys=$1
    [ "$sys" = jetstream ] || purge "$sys"
    "$SB" --system "$([ "$sys" = jetstream ] && echo jetstream || echo rdmabroker)" -s "${URL[$sys]}" \
      --what "$2" --size "$3" -n "$4" >"$TMP/$sys-$2-$3-$5.json"
  }
  for i in $(seq "$RUNS"); do
    for sys in interval jetstream group; do
      run "$sys" publish 64 200000 "$i"
      run "$sys" publish 1024 200000 "$i"
      run "$sys" latency 64 2000 "$i"
      run "$sys" replay 64 1000000 "$i"
    done
  done
  python3 - "$TMP" "$RUNS" "$(nats-server --version)" <<'EOF' | doc_table "streams-tcp-$RUNS"
import json, os, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def med(sys_, what, size, key):
    return statistics.median(json.load(open(f"{d}/{sys_}-{what}-{size}-{i}.json"))[key] for i in range(1, runs + 1))
rows = [("durable publish, 64 B (msg/s)", "publish", 64, "msgs_per_s", 1.5, True),
        ("durable publish, 1 KiB (msg/s)", "publish", 1024, "msgs_per_s", 1.5, True),
        ("acknowledgement p50 (µs)", "latency", 64, "p50_us", 1.0, False),
        ("acknowledgement p99 (µs)", "latency", 64, "p99_us", None, False),
        ("replay of 1,000,000 × 64 B (msg/s)", "replay", 64, "msgs_per_s", 1.5, True)]
print(f"Median of {runs} alternating runs on this host's loopback and disk ({sys.argv[3]}, {os.cpu_count()} cores).")
print("`interval`: rdmabroker with `sync: interval`, JetStream's own policy (acknowledged once written);")
print("`group`: the default, acknowledged after `fdatasync` (stricter, for the record).")
print()
print("| measure | rdmabroker `interval` | JetStream | ratio | target | rdmabroker `group` |")
print("|---|---|---|---|---|---|")
for name, what, size, key, target, higher in rows:
    ours, theirs, grp = (med(s, what, size, key) for s in ("interval", "jetstream", "group"))
    ratio = ours / theirs if higher else theirs / ours
    goal = "" if target is None else (f"≥ {target}×" if higher else "≤ JetStream's")
    met = "" if target is None else (" ✓" if ratio >= target else " ✗")
    print(f"| {name} | {ours:,.0f} | {theirs:,.0f} | {ratio:.2f}×{met} | {goal} | {grp:,.0f} |")
EOF
  exit 0
fi

# ---------------------------------------------------------------- rdma (in the guest)
[ "${RDMABROKER_GUEST:-}" = 1 ] || ninja -C "$BIN" stream_bench >/dev/null
RUNS=${2:-5}
in_guest_unless_rdma tests/bench/streams.sh rdma "$RUNS"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
DATA=$TMP/data
PORT=$((24000 + RANDOM % 400))
broker rdma group "$PORT" "$A1"
SRV="rdma://$A1:$PORT"
# RUNS rounds, each measure once per round in turn: a boot's rates drift
# (the plain relay has made 80,000 and 178,000 msg/s in one boot), so each
# ratio is of the medians of the same rounds.
for run in $(seq "$RUNS"); do
  "$BIN/client-lib/rdmabroker" bench -s "$SRV" -b "$A2" --size 64 -n 200000 --quiet --json >"$TMP/relay-$run.json"
  # The same, on a subject the stream takes: every message stored too, nobody waiting for a sync.
  "$BIN/client-lib/rdmabroker" bench bench.live -s "$SRV" -b "$A2" --size 64 -n 200000 --quiet --json \
    >"$TMP/captured-$run.json"
  purge rdma
  "$SB" -s "$SRV" -b "$A2" --what publish --size 64 -n 200000 >"$TMP/publish-$run.json"
  purge rdma
  # As fast as the library lets a publisher go: 512 unanswered, its own limit
  # (half the 1,024 unread answers the broker allows a client, SPEC.md §6).
  "$SB" -s "$SRV" -b "$A2" --what publish --size 64 -n 200000 --window 512 >"$TMP/publish-512-$run.json"
  purge rdma
  "$SB" -s "$SRV" -b "$A2" --what replay --size 64 -n 200000 >"$TMP/replay-$run.json"
  purge rdma
done
python3 - "$TMP" "$RUNS" <<'EOF' | doc_table streams-rdma
import json, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def rates(name, bench):
    out = []
    for r in range(1, runs + 1):
        j = json.load(open(f"{d}/{name}-{r}.json"))
        out.append(j["aggregate"]["delivery_msgs_per_s"] if bench else j["msgs_per_s"])
    return statistics.median(out), out
def cell(m):
    return f"{m[0]:,.0f} ({' / '.join(f'{x:,.0f}' for x in m[1])})"
relay, cap = rates("relay", True), rates("captured", True)
pub, pub512, rep = rates("publish", False), rates("publish-512", False), rates("replay", False)
r = relay[0]
print(f"Soft-RoCE guest, one boot, 64 B; the stream on the guest's tmpfs, `sync: group`; medians of {runs} rounds, each running every measure once in this order.")
print()
print("| measure | msg/s: median (runs) | against | ratio of the medians | target |")
print("|---|---|---|---|---|")
print(f"| plain relay, 1 → 1 (`rdmabroker bench`) | {cell(relay)} | | | |")
print(f"| relayed and stored, no acknowledgements (`rdmabroker bench bench.live`) | {cell(cap)} | the plain relay | {cap[0] / r:.2f}× | |")
print(f"| durable publish, 256 unanswered at most (as the TCP table) | {cell(pub)} | the plain relay | {pub[0] / r:.2f}× | |")
print(f"| durable publish, flat out: 512 unanswered, the library's limit | {cell(pub512)} | the plain relay | {pub512[0] / r:.2f}×{' ✓' if pub512[0] / r >= 0.5 else ' ✗'} | ≥ 0.5× |")
print(f"| replay of 200,000 to a new consumer | {cell(rep)} | the live delivery (the relay) | {rep[0] / r:.2f}×{' ✓' if rep[0] / r >= 1 else ' ✗'} | ≥ 1× |")
EOF
