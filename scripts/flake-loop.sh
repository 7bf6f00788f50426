#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the host suite (unit and TCP tests) of one build tree RUNS times in a
# row while stress-ng keeps both cores busy, and stops at the first failure:
# a test that fails once in twenty runs is a race to fix, not to retry.
#   scripts/flake-loop.sh [RUNS] [TREE] [CTEST ARGS...]   (defaults: 20 build/release)
# For the guest suite: RDMABROKER_GUEST_RUNS=3 tests/softroce/run-in-guest.sh
#   tests/softroce/guest-suite.sh build/release (see docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20}
TREE=${2:-build/release}
shift $(( $# > 2 ? 2 : $# ))
command -v stress-ng >/dev/null || { echo "flake-loop: stress-ng is missing (scripts/install-deps.sh)" >&2; exit 2; }
stress-ng --cpu 2 --timeout 0 --quiet &
STRESS=$!
trap 'kill $STRESS 2>/dev/null || true' EXIT
passed=0
failed=0
for i in $(seq "$RUNS"); do
  start=$SECONDS
  if ctest --test-dir "$TREE" -L 'unit|tcp' -j 2 --output-on-failure "$@" >"/tmp/flake-loop-$i.log" 2>&1; then
    passed=$((passed + 1))
    echo "flake-loop: run $i passed ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    echo "flake-loop: run $i FAILED ($((SECONDS - start)) s), log /tmp/flake-loop-$i.log:"
    grep -E "\(Failed\)|\*\*\*|Failure" "/tmp/flake-loop-$i.log" | head -20
    break
  fi
done
echo "flake-loop: $passed passed, $failed failed"
[ "$failed" = 0 ]
