#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the micro-benchmarks of the release tree (builds it if needed):
#   tests/bench/micro.sh [google-benchmark flags...]
# e.g. --benchmark_format=json. Results go to stdout; docs/benchmarks.md
# quotes a run with the command that produced it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${RDMABROKER_BIN:-build/release}
[ -f "$BIN/CMakeCache.txt" ] || scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BIN" micro_bench >/dev/null
exec "$BIN/tests/bench/micro/micro_bench" --benchmark_min_time=0.2 "$@"
