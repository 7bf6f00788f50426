#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Credits by demand (SPEC.md §5.1) on the broker's DEFAULT configuration, in
# one Soft-RoCE guest boot (ratios only: the emulated device is slow):
#   1. a 1 -> 1 pair at 64 B, alone;
#   2. P publishers for D seconds, flat out with no subscriber (what they
#      share is the broker's intake: their credits), then at R msg/s each to
#      one subscriber (flat out, 100 publishers in one process outrun one
#      subscriber on 2 emulated vCPUs, and it is cut as a slow consumer): how
#      evenly they get through (Jain's fairness index over what each published);
#   3. N idle RDMA clients connected (one process, one after another): the
#      time, the broker's RSS per client, the credits they hold against what
#      the receive queues may hold, refusals;
#   4. the same pair with the N clients still connected: its rate against (1);
#   5. RNR NAKs the devices sent during all this (hw_counters): credits keep
#      a receive posted for every SEND, so it must stay 0.
#   tests/bench/credits.sh [N] [P] [D] [R]    (defaults 1000 100 5 50)
# Pair rates are the median of 3 runs. The list goes into docs/benchmarks.md's
# section credits-N-P-D-R when it has one (doc_table, suite-lib.sh).
# Connect rate against raw rdma_cm is tests/bench/connect-rate.sh; with
# CONNECT_RATE=1 it runs after these, in the same boot.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000}
P=${2:-100}
D=${3:-5}
R=${4:-50}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
host_build hold_connections rdmabrokerd rdmabroker_cli
in_guest_unless_rdma env CONNECT_RATE="${CONNECT_RATE:-0}" "$0" "$@"
A1=${RDMABROKER_GUEST_ADDR1:-127.0.0.1}
A2=${RDMABROKER_GUEST_ADDR2:-127.0.0.1}
SOCK=/tmp/credits-$$.sock
URL=rdma://$A1:7477
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
CLI="$BIN/client-lib/rdmabroker"

rnr_naks() {  # RNR NAKs sent by every RDMA device (rxe: send_rnr_err; mlx5: out_of_buffer)
  local f sum=0
  for f in /sys/class/infiniband/*/ports/*/hw_counters/{send_rnr_err,out_of_buffer}; do
    [ -r "$f" ] && sum=$((sum + $(cat "$f")))
  done
  echo "$sum"
}
stat_of() { "$CLI" stat --admin-socket "$SOCK" | awk -v k="$1" '$1 == k { print $2 }'; }
pair_rate() {  # msg/s delivered by one publisher to one subscriber, 64 B: the median of 3 runs (after one not counted)
  for run in 0 1 2 3; do
    "$CLI" bench -s "$URL" -b "$A2" -p 1 -m 1 -n 20000 --size 64 --json --quiet |
      python3 -c 'import json,sys; print(round(json.load(sys.stdin)["aggregate"]["delivery_msgs_per_s"]))' |
      { [ "$run" = 0 ] && cat >/dev/null || cat; }
  done | sort -n | tee /tmp/credits-pair-$$.txt | sed -n 2p
}
pair_runs() { sort -n /tmp/credits-pair-$$.txt | paste -sd/; }

{
RNR0=$(rnr_naks)
# Defaults only: what a first deployment runs (start_broker adds --workers 2,
# the guest's core count, and anonymous clients).
start_broker --port 7477
rss() { awk '/^VmRSS/{print $2}' "/proc/$BROKER/status"; }
echo "- broker on defaults: capacity $(stat_of rdma.credit_capacity) credits, max_connections 1024"

ALONE=$(pair_rate)
echo "- 1 → 1 at 64 B, alone: $ALONE msg/s (runs: $(pair_runs))"

fairness() {  # SUBSCRIBERS RATE (0: flat out)
  "$CLI" bench -s "$URL" -b "$A2" -p "$P" -m "$1" -d "$D" -r "$2" --size 64 --json --quiet \
    > /tmp/credits-fair-$$.json || true
  python3 - "$P" "$D" "$1" "$2" /tmp/credits-fair-$$.json <<'EOF'
import json, sys
p, d, subs, rate, path = sys.argv[1:6]
r = json.load(open(path))
a = r["aggregate"]
sent = sorted(x["sent"] for x in r["publishers"])
what = f"{rate} msg/s each" if rate != "0" else "flat out"
to = f"{subs} subscriber" if subs != "0" else "no subscriber (the broker's intake alone)"
print(f"- {p} publishers, {what}, → {to}, {d} s: {a['published']} published "
      f"({a['publish_msgs_per_s']:.0f} msg/s), {a['received']} received, lost {a['lost']}; per publisher "
      f"min {sent[0]} / median {sent[len(sent) // 2]} / max {sent[-1]}; Jain's fairness index "
      f"{a['publisher_fairness']:.3f}")
EOF
}
fairness 0 0
fairness 1 "$R"
rm -f /tmp/credits-fair-$$.json

BEFORE=$(rss)
T0=$SECONDS
exec 3> >("$BIN/tests/bench/micro/hold_connections" "$URL" "$N" "$A2" > /tmp/credits-hold-$$.out; echo exited >> /tmp/credits-hold-$$.out)
for _ in $(seq 2400); do grep -q -e '^held' -e '^exited' /tmp/credits-hold-$$.out 2>/dev/null && break; sleep 0.5; done
grep -q '^held' /tmp/credits-hold-$$.out || { echo "credits: the holder did not connect:" >&2; cat /tmp/credits-hold-$$.out >&2; exit 1; }
HELD_S=$((SECONDS - T0))
sleep 2  # idle: every window asked back to 2
AFTER=$(rss)
CONNS=$(stat_of connections.current)
echo "- $CONNS idle RDMA clients connected in ${HELD_S} s; broker RSS $((BEFORE / 1024)) → $((AFTER / 1024)) MiB," \
  "$(( (AFTER - BEFORE) / (CONNS > 0 ? CONNS : 1) )) KiB per client; credits held $(stat_of rdma.credits_granted)" \
  "of $(stat_of rdma.credit_capacity); refused $(stat_of rdma.credit_refusals); srq posted $(stat_of rdma.srq_posted)," \
  "pool in use $(stat_of pool.in_use) of $(stat_of pool.buffers)"

LOADED=$(pair_rate)
awk -v a="$ALONE" -v b="$LOADED" -v n="$CONNS" 'BEGIN {
  printf "- 1 → 1 at 64 B with %d idle clients connected: %d msg/s, %.2f× its rate alone", n, b, b / a }'
echo " (runs: $(pair_runs))"
exec 3>&-
for _ in $(seq 120); do grep -q '^exited' /tmp/credits-hold-$$.out 2>/dev/null && break; sleep 0.5; done
rm -f /tmp/credits-hold-$$.out /tmp/credits-pair-$$.txt
stop_broker
echo "- RNR NAKs sent by the devices during the run: $(( $(rnr_naks) - RNR0 ))"
} | doc_table "credits-$N-$P-$D-$R"
if [ "${CONNECT_RATE:-0}" = 1 ]; then tests/bench/connect-rate.sh "$N"; fi
