#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Load and soak over RDMA: CONNS client connections held for the whole run,
# each with a subscription of its own and one to a fan-out subject, while
# mixed traffic runs at fixed rates for MINUTES:
#   - fan-out: 1 publisher -> every held connection, 2 msg/s of 32 B;
#   - small:   2 publishers -> 2 subscribers, 100 msg/s each of 64 B;
#   - large:   1 publisher -> 2 subscribers, 10 msg/s of 3,000 B
# (about 3,000 SENDs/s in all, the fan-out 2,000 of them: well inside the
# ~10,000 packets/s the emulated guest's Soft-RoCE moves, so latency measures
# the broker rather than a backlog; at 10 msg/s of fan-out to 1,000
# connections the fabric alone was saturated and latencies grew to minutes).
# Checks exact delivery (every held connection got every fan-out message;
# the benches lost, reordered and corrupted nothing), then that the broker
# returns to its baseline once everyone has left: no connection, every pool
# buffer back (each one free or posted on an SRQ: pool.in_use equals
# rdma.srq_posted, which the refill keeps above 3/4 of its start), RSS within
# 10 % (+ 4 MiB) of where it started. Prints the numbers (into
# docs/benchmarks.md's section soak-MINUTES-CONNS too, when it has one:
# doc_table, suite-lib.sh); exit 1 on any failure.
#   tests/bench/soak.sh [MINUTES] [CONNS]     (in the Soft-RoCE guest when
#                                              the host has no RDMA device)
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=${1:-10}
CONNS=${2:-1000}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/soak.sh "$MINUTES" "$CONNS"
SECS=$((MINUTES * 60))
SOCK=/tmp/soak-$$.sock
OUT=/tmp/soak-$$
mkdir -p "$OUT"
URL=rdma://${RDMABROKER_GUEST_ADDR1:-127.0.0.1}:7490
BIND=(${RDMABROKER_GUEST_ADDR2:-})
CLI="$BIN/client-lib/rdmabroker"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# Smaller buffers, fewer credits and deeper SRQs than the defaults, as in every
# earlier soak run (its numbers stay comparable); the defaults also take 1,000
# idle RDMA clients now (credits by demand: tests/bench/credits.sh).
"$BIN/daemon/rdmabrokerd" --allow-anonymous --port 7490 --tcp-port 0 --admin-socket "$SOCK" --metrics-listen "" \
  --workers 2 --log-level warn --max-connections $((CONNS + 64)) \
  --credits 4 --srq-depth 4096 --pool-buffers 16384 --buffer-size 4096 &
B=$!
trap 'kill $B 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
stat_of() { "$CLI" stat --admin-socket "$SOCK" | awk -v k="$1" '$1==k{print $2}'; }
rss() { awk '/^VmRSS/{print $2}' "/proc/$B/status"; }
sleep 1
RSS0=$(rss); POOL0=$(stat_of pool.in_use); SRQ0=$(stat_of rdma.srq_posted)
echo "soak: baseline: RSS $((RSS0 / 1024)) MiB, pool.in_use $POOL0, rdma.srq_posted $SRQ0"

T0=$(date +%s)
exec 3> >(HOLD_SUBJECT=soak.fan "$BIN/tests/bench/micro/hold_connections" "$URL" "$CONNS" "${BIND[@]}" >"$OUT/hold" 2>&1;
          echo exited >>"$OUT/hold")
for _ in $(seq 2400); do grep -q -e '^held' -e '^exited' "$OUT/hold" 2>/dev/null && break; sleep 0.5; done
grep -q '^held' "$OUT/hold" || { echo "soak: the holder did not connect:"; cat "$OUT/hold"; exit 1; }
HELD_S=$(($(date +%s) - T0))
echo "soak: $CONNS connections held after $HELD_S s; traffic for $SECS s"
RSS_HELD=$(rss)

B_ARGS=(-s "$URL" --json --quiet -d "$SECS")
[ ${#BIND[@]} -gt 0 ] && B_ARGS+=(-b "${BIND[0]}")
"$CLI" bench soak.fan -p 1 -m 0 --size 32 --rate 2 "${B_ARGS[@]}" >"$OUT/fan.json" 2>"$OUT/fan.err" &
F=$!
"$CLI" bench soak.small -p 2 -m 2 --size 64 --rate 100 "${B_ARGS[@]}" >"$OUT/small.json" 2>"$OUT/small.err" &
S=$!
"$CLI" bench soak.large -p 1 -m 2 --size 3000 --rate 10 "${B_ARGS[@]}" >"$OUT/large.json" 2>"$OUT/large.err" &
L=$!
PEAK=0
while kill -0 $F 2>/dev/null || kill -0 $S 2>/dev/null || kill -0 $L 2>/dev/null; do
  r=$(rss); [ "$r" -gt "$PEAK" ] && PEAK=$r
  sleep 5
done
wait $F $S $L || true
sleep 2  # the last fan-out messages reach the holders
RSS_LOADED=$(rss)
STATS_LOADED=$("$CLI" stat --admin-socket "$SOCK")
exec 3>&-  # the holders close
for _ in $(seq 600); do grep -q '^exited' "$OUT/hold" 2>/dev/null && break; sleep 0.5; done
for _ in $(seq 300); do [ "$(stat_of connections.current)" = 0 ] && break; sleep 0.2; done
sleep 2
RSS1=$(rss); POOL1=$(stat_of pool.in_use); SRQ1=$(stat_of rdma.srq_posted); CONN1=$(stat_of connections.current)

{
echo "$CONNS RDMA connections held for $MINUTES minutes of traffic ($(uname -r)); connecting them took $HELD_S s"
echo
fail=0
check() { if eval "$2"; then echo "- ok: $1"; else echo "- **FAIL**: $1"; fail=1; fi; }
FAN_SENT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["aggregate"]["published"])' "$OUT/fan.json" 2>/dev/null || echo -1)
read -r _ GOT_MIN GOT_MAX < <(grep '^received' "$OUT/hold" || echo "received -1 -1")
for b in small large; do
  python3 - "$OUT/$b.json" "$b" <<'PY' || fail=1
import json, sys
a = json.load(open(sys.argv[1]))["aggregate"]
ok = a["lost"] == 0 and a["reordered"] == 0 and a["malformed"] == 0 and a["received"] == a["expected"] > 0
print(("- ok: " if ok else "- **FAIL**: ") + f"{sys.argv[2]}: {a['published']} published, {a['received']} of {a['expected']} received, "
      f"lost {a['lost']}, reordered {a['reordered']}, p50 {a['latency']['p50_us']:.0f} µs, p99 {a['latency']['p99_us']:.0f} µs")
sys.exit(0 if ok else 1)
PY
done
check "fan-out: $FAN_SENT published, each of $CONNS connections received between $GOT_MIN and $GOT_MAX" \
  '[ "$FAN_SENT" -gt 0 ] && [ "$GOT_MIN" = "$FAN_SENT" ] && [ "$GOT_MAX" = "$FAN_SENT" ]'
DROPPED=$(awk '$1 ~ /^messages.dropped/ {s += $2} END {print s + 0}' <<<"$STATS_LOADED")
check "no message dropped by the broker ($DROPPED)" '[ "$DROPPED" = 0 ]'
check "every connection closed (connections.current $CONN1)" '[ "$CONN1" = 0 ]'
check "every pool buffer free or posted (pool.in_use $POOL1 = rdma.srq_posted $SRQ1; at start $POOL0 = $SRQ0)" \
  '[ "$POOL1" = "$SRQ1" ]'
check "SRQs refilled (rdma.srq_posted $SRQ1 >= 3/4 of $SRQ0)" '[ "$SRQ1" -ge $((SRQ0 * 3 / 4)) ]'
check "RSS back near baseline ($((RSS0 / 1024)) MiB → $((RSS1 / 1024)) MiB)" \
  '[ "$RSS1" -le $((RSS0 + RSS0 / 10 + 4096)) ]'
echo "- RSS $((RSS0 / 1024)) MiB at start, $((RSS_HELD / 1024)) MiB with $CONNS connections, peak $((PEAK / 1024)) MiB under traffic, $((RSS_LOADED / 1024)) MiB at the end of traffic, $((RSS1 / 1024)) MiB after everyone left; $(( $(date +%s) - T0 )) s in all"
echo "$fail" >"$OUT/fail"
} | doc_table "soak-$MINUTES-$CONNS"
fail=$(cat "$OUT/fail")
rm -rf "$OUT"
exit $fail
