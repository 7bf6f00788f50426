#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The raw relay floor (issue 47): tests/bench/raw_relay's publisher -> relay
# -> subscriber on raw verbs (RC, 64-byte SENDs, no framing, no routing), the
# relay on ADDR1 (rxe0), publisher and subscriber bound to ADDR2 (rxe1): the
# same places and schedule as `rdmabroker bench -r RATE -d SECONDS` against a
# broker. MODE: events (relay and subscriber sleep on their completion
# channels) or polled (they spin; the publisher sleeps until each message is
# due in both, as the bench's does). Prints the subscriber's report; the last line
# is `p50_us N` (from the publisher's post call to the subscriber's
# completion).
# MODE bulk measures bytes per second instead: COUNT messages of SIZE bytes
# flat out, the relay forwarding each from the buffer it arrived in; the
# last line is `mb_per_s N` (10^6 bytes, from the publisher's start to the
# last delivery: what `rdmabroker bench --size SIZE -n COUNT` reports as
# delivery_mb_per_s).
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/raw-relay.sh MODE [RATE] [SECONDS]    (defaults 200 5)
#   sudo tests/bench/raw-relay.sh bulk SIZE COUNT
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:?usage: raw-relay.sh events|polled [RATE] [SECONDS] | bulk SIZE COUNT}
RATE=${2:-200}
SECS=${3:-5}
BIN=${RDMABROKER_BIN:-build/release}
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh
[ "${RDMABROKER_GUEST:-}" = 1 ] || ninja -C "$BIN" raw_relay >/dev/null
in_guest_unless_rdma tests/bench/raw-relay.sh "$MODE" "$RATE" "$SECS"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
RR=$BIN/tests/bench/micro/raw_relay
LOG=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$LOG"' EXIT
# wait_for FILE TEXT: until the process writing FILE has said TEXT (10 s at most).
wait_for() {
  for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "raw-relay: no '$2' in $1:" >&2
  cat "$1" >&2
  exit 1
}
PORT=$((19000 + RANDOM % 400))
if [ "$MODE" = bulk ]; then
  SIZE=$RATE COUNT=$SECS
  "$RR" bulk-relay "$A1" "$PORT" "$SIZE" >"$LOG/relay" 2>&1 &
  PIDS+=($!)
  wait_for "$LOG/relay" listening
  "$RR" bulk-sub "$A1" "$PORT" "$A2" "$SIZE" "$COUNT" >"$LOG/sub" 2>&1 &
  SUB=$!
  PIDS+=($SUB)
  wait_for "$LOG/sub" connected
  timeout 600 "$RR" bulk-pub "$A1" "$PORT" "$A2" "$SIZE" "$COUNT"
else
  "$RR" relay "$A1" "$PORT" "$MODE" >"$LOG/relay" 2>&1 &
  PIDS+=($!)
  wait_for "$LOG/relay" listening
  "$RR" sub "$A1" "$PORT" "$MODE" "$A2" >"$LOG/sub" 2>&1 &
  SUB=$!
  PIDS+=($SUB)
  wait_for "$LOG/sub" connected
  timeout $((SECS + 60)) "$RR" pub "$A1" "$PORT" "$MODE" "$A2" "$RATE" "$SECS"
fi
timeout 30 tail --pid="$SUB" -f /dev/null || true
grep -v connected "$LOG/sub"
