#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Connection setup rate over RDMA, ours against a raw rdma_cm loop, in one
# guest boot (ratios only: the emulated device is slow).
#   tests/bench/connect-rate.sh [N]
# Prints, for N connections:
#   raw      rdma-core's ucmatose: N RC connections set up and torn down
#            between two processes (QP, CQ, MR each), no broker
#   broker   N librdmabroker clients connecting one after another (and from
#            4 threads) to rdmabrokerd, each held until all are up
# as a list that goes into docs/benchmarks.md's section connect-rate-N when
# it has one (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-200}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
host_build connect_rate rdmabrokerd
in_guest_unless_rdma "$0" "$@"
A1=${RDMABROKER_GUEST_ADDR1:-127.0.0.1}
A2=${RDMABROKER_GUEST_ADDR2:-127.0.0.1}
SOCK=/tmp/connect-rate-$$.sock
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

{
  # Raw: the server accepts N, the client connects N (all at once: ucmatose
  # issues every connect, then serves the events), no messages.
  ucmatose -b "$A1" -p 7479 -c "$N" -C 0 >/tmp/connect-rate-srv-$$.log 2>&1 &
  SRV=$!
  sleep 1
  T0=$(date +%s.%N)
  ucmatose -s "$A1" -b "$A2" -p 7479 -c "$N" -C 0 >/tmp/connect-rate-cli-$$.log 2>&1 || {
    cat /tmp/connect-rate-cli-$$.log >&2
    exit 1
  }
  T1=$(date +%s.%N)
  wait "$SRV" || true
  awk -v n="$N" -v a="$T0" -v b="$T1" 'BEGIN {
    printf "- raw rdma_cm (ucmatose): %d connections up and down in %.1f s, %.1f connections/s\n", n, b - a, n / (b - a) }'
  rm -f /tmp/connect-rate-srv-$$.log /tmp/connect-rate-cli-$$.log

  # The broker on its defaults: credits by demand give each idle client 2
  # (SPEC.md §5.1), so N clients fit its receive queues.
  start_broker --port 7478 --max-connections $((N + 16))
  for threads in 1 4; do
    "$BIN/tests/bench/micro/connect_rate" "rdma://$A1:7478" "$N" "$A2" "$threads" | sed "s/^connect_rate: /- rdmabroker (librdmabroker clients): /"
  done
} | doc_table "connect-rate-$N"
