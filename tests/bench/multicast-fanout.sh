#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fan-out through rdmabrokerd, unicast against multicast, in one run:
# 1 publisher -> 1, 4, 16 and 32 subscribers (`rdmabroker bench`), once with
# the subject served by one RC send per subscriber and once by its multicast
# group (multicast.subjects), on the same devices. Reports delivered
# messages/s (all subscribers together), the broker's CPU time per delivered
# message, and how the broker sent them (group messages, RC copies, repairs).
# Runs where RDMA devices exist; elsewhere in the Soft-RoCE guest:
#   tests/bench/multicast-fanout.sh [COUNT] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-20000}
SIZE=${2:-64}
BIN=${RDMABROKER_BIN:-build/release}
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/multicast-fanout.sh "$COUNT" "$SIZE"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
CLI="$BIN/client-lib/rdmabroker"
SOCK=/tmp/mcast-bench.sock
URL=rdma://$A1:7492

start_mode() {  # MODE: unicast | multicast
  local enabled=false
  [ "$1" = multicast ] && enabled=true
  printf 'multicast:\n  enabled: %s\n  subjects: ["bench"]\n' "$enabled" >/tmp/mcast-bench.yaml
  start_broker --config /tmp/mcast-bench.yaml --port 7492 --buffer-size 32768 --pool-buffers 8192
}
stat_of() { "$CLI" stat --json --admin-socket "$SOCK" | python3 -c "import json,sys; print(json.load(sys.stdin)['stats'].get('$1', 0))"; }

{
echo "| subscribers | mode | delivered msg/s | broker CPU µs / delivered msg | datagrams | group messages | RC copies | repairs served | publisher stalls |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
for m in 1 4 16 32; do
  for mode in unicast multicast; do
    start_mode "$mode"
    # Subscribers alternate between the two devices' addresses.
    c0=$(cpu_ticks "$BROKER")
    # Receive buffers as large as the broker's: a group is only for members
    # that can read its sequenced DELIVERs whole (SPEC.md §7).
    "$CLI" bench -s "$URL" -b "$A2" --size "$SIZE" -p 1 -m "$m" -n "$COUNT" --recv-buffer-size 32768 \
      --json --quiet >/tmp/mcast-bench.json
    c1=$(cpu_ticks "$BROKER")
    python3 - "$m" "$mode" "$c0" "$c1" "$(getconf CLK_TCK)" "$(stat_of multicast.datagrams)" \
      "$(stat_of multicast.group_messages)" "$(stat_of multicast.unicast_copies)" "$(stat_of multicast.repairs_served)" \
      "$(stat_of producer_stalls)" <<'EOF'
import json, sys
m, mode, c0, c1, tck, datagrams, group, copies, repairs, stalls = sys.argv[1:]
r = json.load(open("/tmp/mcast-bench.json"))["aggregate"]
received = r["received"]
cpu_us = (int(c1) - int(c0)) / int(tck) * 1e6
print(f"| {m} | {mode} | {r['delivery_msgs_per_s']:,.0f} | {cpu_us / max(received, 1):.2f} | {datagrams} | {group} | {copies} | {repairs} | {stalls} |"
      + ("" if received == r["expected"] else f" (received {received} of {r['expected']})"))
EOF
    stop_broker
  done
done
} | doc_table "multicast-fanout-$COUNT-$SIZE"
