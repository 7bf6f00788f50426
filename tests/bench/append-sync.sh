#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pwrite per record, one pwritev per group (what the store does) and
# io_uring, each with fdatasync, for a stream's appends (issue 46):
# tests/bench/append_sync on this host's disk (under build/, not a tmpfs),
# 64 B and 1 KiB records, groups of 1 (sync: always, one publisher) and 64
# (group commit). The table goes into docs/benchmarks.md's section append-sync.
#   tests/bench/append-sync.sh [COUNT]     (default 20000 records per way)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
COUNT=${1:-20000}
BIN=${RDMABROKER_BIN:-build/release}
ninja -C "$BIN" append_sync >/dev/null
DIR=$(mktemp -d -p "$PWD/build" append-sync.XXXX)
trap 'rm -rf "$DIR"' EXIT
{
  echo "$COUNT records per way, each way run twice (the second shown), on this host's disk ($(df --output=source "$DIR" | tail -1))."
  echo
  echo "| record | group | pwrite each + fdatasync: records/s | p50 µs | one pwritev + fdatasync: records/s | p50 µs | io_uring: records/s | p50 µs |"
  echo "|---|---|---|---|---|---|---|---|"
  for size in 64 1024; do
    for group in 1 64; do
      "$BIN/tests/bench/micro/append_sync" "$DIR" "$size" "$COUNT" "$group" | tail -3 | python3 -c '
import json, sys
w, v, u = (json.loads(l) for l in sys.stdin)
cells = [w["size"], w["group"], w["records_per_s"], w["p50_us"], v["records_per_s"], v["p50_us"], u["records_per_s"], u["p50_us"]]
print("| {} B | {} | {:,.0f} | {:.0f} | {:,.0f} | {:.0f} | {:,.0f} | {:.0f} |".format(*cells))'
    done
  done
} | doc_table append-sync
