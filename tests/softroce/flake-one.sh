#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the Soft-RoCE guest: one gtest filter RUNS times in a row
# while other work loads the guest, and keeps the whole output of every
# failed run. A race that shows once in fifty runs of the suite shows here in
# minutes (docs/testing.md, "The flake loop"):
#
#   tests/softroce/run-in-guest.sh env RDMABROKER_GUEST=1 \
#     tests/softroce/flake-one.sh build/release/tests/rdma/routing_tests \
#     'Via/Resilience.ClientsReconnect*/rdma' 60 \
#     build/release/tests/rdma/multicast_tests 'Multicast.*'
#
# The last two arguments (optional) name a test binary and filter run in a
# loop beside it; FLAKE_HOG=1 adds one CPU hog (stress-ng). Failed runs'
# output goes to $FLAKE_OUT (default build/flake), one file per run.
set -uo pipefail
if [ "${RDMABROKER_GUEST:-}" != 1 ]; then
  echo "flake-one: run through tests/softroce/run-in-guest.sh" >&2
  exit 1
fi
if [ $# -lt 3 ]; then
  echo "usage: flake-one.sh TEST_BINARY GTEST_FILTER RUNS [LOAD_BINARY LOAD_FILTER]" >&2
  exit 2
fi
bin=$(realpath "$1") filter=$2 runs=$3
load_bin=${4:+$(realpath "$4")} load_filter=${5:-*}
out=$(realpath -m "${FLAKE_OUT:-build/flake}")
mkdir -p "$out"
helpers=()
stop_helpers() { for p in "${helpers[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_helpers EXIT
if [ -n "$load_bin" ]; then
  (while true; do "$load_bin" --gtest_filter="$load_filter" >/dev/null 2>&1; done) &
  helpers+=($!)
fi
if [ "${FLAKE_HOG:-}" = 1 ]; then
  stress-ng --cpu 1 --quiet &
  helpers+=($!)
fi
cd "$(dirname "$bin")" || exit 1
failed=0
for run in $(seq "$runs"); do
  start=$(date +%s%N)
  if ! timeout 600 "$bin" --gtest_filter="$filter" >"$out/run.log" 2>&1; then
    failed=$((failed + 1))
    mv "$out/run.log" "$out/failed-run-$run.log"
    echo "run $run FAILED: $out/failed-run-$run.log"
    grep -A6 ": Failure$" "$out/failed-run-$run.log" | head -20
  fi
  echo "run $run: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
rm -f "$out/run.log"
echo "flake-one: $failed of $runs runs failed ($filter)"
[ "$failed" = 0 ]
