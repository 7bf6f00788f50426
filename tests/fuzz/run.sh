#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (clang, ASan + UBSan) into build/fuzz, replays
# the committed seed corpus and earlier findings as a regression check, then
# fuzzes each target for SECONDS (default 60) and prints its execution count.
# Targets run RDMABROKER_FUZZ_JOBS at a time (default: one per core; each
# fuzzer is one process on one core).
# New corpus entries go to build/fuzz/corpus/, crashes to build/fuzz/artifacts/;
# the committed corpus is never modified (copy a finding into
# tests/fuzz/regressions/<target>/ once it is fixed).
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=${*:-fuzz_frame fuzz_handshake fuzz_subject fuzz_config fuzz_store}
JOBS=${RDMABROKER_FUZZ_JOBS:-$(nproc)}
OUT=build/fuzz

# shellcheck source=scripts/lib/ccache.sh
. scripts/lib/ccache.sh
cmake -S tests/fuzz -B "$OUT" -G Ninja -DCMAKE_CXX_COMPILER=clang++ "${CCACHE_ARGS[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$OUT"
mkdir -p "$OUT/artifacts"

# fuzz_one TARGET: replay, then fuzz; what it has to say goes to $OUT/TARGET.summary.
fuzz_one() {
  local t=$1 seeds=tests/fuzz/corpus/$1 regressions=tests/fuzz/regressions/$1 work=$OUT/corpus/$1
  mkdir -p "$work" "$regressions"
  if ! "$OUT/$t" -runs=0 "$seeds" "$regressions" >"$OUT/$t.replay.log" 2>&1; then
    { echo "$t: replaying the seeds and regressions FAILED"; tail -30 "$OUT/$t.replay.log"; } >"$OUT/$t.summary"
    return 1
  fi
  # -max_len bounds one input (a config file or a receive buffer's worth);
  # -rss_limit_mb keeps a leak or blow-up from taking the machine.
  local dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  if "$OUT/$t" "${dict[@]}" -max_total_time="$SECONDS_EACH" -max_len=20000 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$OUT/artifacts/$t-" "$work" "$seeds" >"$OUT/$t.log" 2>&1; then
    local execs cov
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$OUT/$t.log" | tail -1)
    echo "$t: seeds and regressions replayed; ${execs:-?} executions in ${SECONDS_EACH}s, $cov, corpus $(ls "$work" | wc -l) inputs" >"$OUT/$t.summary"
  else
    { echo "$t: FAILED (input saved under $OUT/artifacts/, if it found one; log: $OUT/$t.log)"; tail -30 "$OUT/$t.log"; } >"$OUT/$t.summary"
    return 1
  fi
}

echo "=== fuzz ${SECONDS_EACH}s each, $JOBS at a time: $TARGETS"
failed=0
pids=() names=()
for t in $TARGETS; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  fuzz_one "$t" &
  pids+=($!) names+=("$t")
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  cat "$OUT/${names[$i]}.summary"
done
exit $failed
