#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The broker's memory per idle connection: RSS of rdmabrokerd before and
# after N clients connect (each with one subscription), per transport.
#   tests/bench/idle-rss.sh tcp [N]     on this host, over loopback TCP
#   tests/bench/idle-rss.sh rdma [N]    over RDMA (through the Soft-RoCE guest
#                                       when this host has no RDMA device)
# With SUBS=K in the environment each connection holds K subscriptions, and
# the cost is also given per subscription: four-token subjects that share no
# trie node (the costliest shape), or with HOLD_SHAPE=shared the first two
# tokens shared by all. The line goes into
# docs/benchmarks.md's section idle-rss-VIA-N (idle-rss-VIA-N-subs-K) when it
# has one (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
VIA=${1:-tcp}
N=${2:-1000}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
SUBS=${SUBS:-1}
host_build hold_connections rdmabrokerd
[ "$VIA" = rdma ] && in_guest_unless_rdma env SUBS="$SUBS" tests/bench/idle-rss.sh rdma "$N"
SOCK=/tmp/idle-rss-$$.sock
# One address holds every subscription here: its share of the broker's
# subscription memory (limits.user_subscription_share_percent) is all of it.
CONFIG=/tmp/idle-rss-$$.yaml
printf 'limits:\n  user_subscription_share_percent: 100\n' >"$CONFIG"
ARGS=(--config "$CONFIG" --port 7490 --tcp-port 7491 --admin-socket "$SOCK" --metrics-listen "" --workers 2
      --log-level warn --max-connections $((N + 16)) --max-subscriptions $((SUBS + 16)))
if [ "$VIA" = tcp ]; then
  ARGS+=(--rdma off)
  URL=tcp://127.0.0.1:7491
  BIND=()
else
  # The defaults: an idle client holds 2 credits (credits by demand,
  # SPEC.md §5.1), so 1,000 fit the default receive queues.
  URL=rdma://${RDMABROKER_GUEST_ADDR1:-127.0.0.1}:7490
  BIND=(${RDMABROKER_GUEST_ADDR2:-})
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # each connection is a socket (TCP) or a few fds (RDMA)
"$BIN/daemon/rdmabrokerd" --allow-anonymous "${ARGS[@]}" &
B=$!
trap 'kill $B 2>/dev/null || true; rm -f "$CONFIG"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
rss() { awk '/^VmRSS/{print $2}' "/proc/$B/status"; }
sleep 1
BEFORE=$(rss)
exec 3> >(HOLD_SUBS=$SUBS "$BIN/tests/bench/micro/hold_connections" "$URL" "$N" "${BIND[@]}" > /tmp/idle-rss-$$.out 2>&1; echo exited >> /tmp/idle-rss-$$.out)
for _ in $(seq 1200); do grep -q -e '^held' -e '^exited' /tmp/idle-rss-$$.out 2>/dev/null && break; sleep 0.5; done
grep -q "^held" /tmp/idle-rss-$$.out || { echo "idle-rss: the holder did not connect:" >&2; cat /tmp/idle-rss-$$.out >&2; exit 1; }
sleep 1
AFTER=$(rss)
STAT=$("$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK")
CONNS=$(awk '$1=="connections.current"{print $2}' <<<"$STAT")
NSUBS=$(awk '$1=="subscriptions"{print $2}' <<<"$STAT")
CHARGED=$(awk '$1=="subscriptions.memory_bytes"{print $2}' <<<"$STAT")
exec 3>&-
NAME=idle-rss-$VIA-$N
[ "$SUBS" = 1 ] || NAME+=-subs-$SUBS
[ "${HOLD_SHAPE:-}" != shared ] || NAME+=-shared
if [ "$SUBS" = 1 ]; then
  awk -v v="$VIA" -v n="$CONNS" -v b="$BEFORE" -v a="$AFTER" 'BEGIN {
    printf "idle-rss: %s, %d idle connections (one subscription each): broker RSS %.1f MiB → %.1f MiB, %.1f KiB per connection\n",
      v, n, b / 1024, a / 1024, (a - b) / n }' | doc_table "$NAME"
else
  awk -v v="$VIA" -v n="$CONNS" -v s="$NSUBS" -v c="$CHARGED" -v b="$BEFORE" -v a="$AFTER" 'BEGIN {
    printf "idle-rss: %s, %d connections with %d subscriptions: broker RSS %.1f MiB → %.1f MiB, %.0f bytes per subscription (charged to limits.max_subscription_memory: %.0f)\n",
      v, n, s, b / 1024, a / 1024, (a - b) * 1024 / s, c / s }' | doc_table "$NAME"
fi
rm -f /tmp/idle-rss-$$.out
