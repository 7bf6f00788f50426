#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the micro-benchmarks of the release tree (builds it if needed):
#   tests/bench/micro.sh                      all of them: a table, also written into
#                                             docs/benchmarks.md's section micro (doc_table)
#   tests/bench/micro.sh [google-benchmark flags...]   as Google Benchmark prints them
# e.g. --benchmark_filter=Relay or --benchmark_format=json.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${RDMABROKER_BIN:-build/release}
[ -f "$BIN/CMakeCache.txt" ] || scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$BIN" micro_bench >/dev/null
[ $# -eq 0 ] || exec "$BIN/tests/bench/micro/micro_bench" --benchmark_min_time=0.2 "$@"
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
JSON=$(mktemp)
trap 'rm -f "$JSON"' EXIT
"$BIN/tests/bench/micro/micro_bench" --benchmark_min_time=0.2 --benchmark_format=json >"$JSON"
python3 - "$JSON" <<'PYEOF' | doc_table micro
import json, sys
r = json.load(open(sys.argv[1]))
ctx = r["context"]
print(f"Host CPU ({ctx.get('num_cpus')} × {ctx.get('mhz_per_cpu')} MHz), release tree")
print()
print("| benchmark | time per iteration | items/s |")
print("|---|---:|---:|")
for b in r["benchmarks"]:
    if b.get("error_occurred"):
        print(f"| `{b['name']}` | failed: {b.get('error_message')} | |")
        continue
    unit = {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
    t = b["cpu_time"] * unit if "real_time" not in b["name"] else b["real_time"] * unit
    items = b.get("items_per_second")
    print(f"| `{b['name']}` | {t:,.1f} ns | {'' if items is None else f'{items:,.0f}'} |")
PYEOF
