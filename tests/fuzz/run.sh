#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build/fuzz, replays
# the committed seed corpus and earlier findings as a regression check, then
# fuzzes each target for SECONDS (default 60) and prints its execution count.
# New corpus entries go to build/fuzz/corpus/, crashes to build/fuzz/artifacts/;
# the committed corpus is never modified (copy a finding into
# tests/fuzz/regressions/<target>/ once it is fixed).
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=${*:-fuzz_frame fuzz_handshake fuzz_subject fuzz_config}
OUT=build/fuzz

cmake -S tests/fuzz -B "$OUT" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$OUT"
mkdir -p "$OUT/artifacts"

failed=0
for t in $TARGETS; do
  seeds=tests/fuzz/corpus/$t
  regressions=tests/fuzz/regressions/$t
  work=$OUT/corpus/$t
  mkdir -p "$work" "$regressions"
  echo "=== $t: replay seeds and regressions"
  if ! "$OUT/$t" -runs=0 "$seeds" "$regressions" >"$OUT/$t.replay.log" 2>&1; then
    tail -30 "$OUT/$t.replay.log"; failed=1; continue
  fi
  echo "=== $t: fuzz ${SECONDS_EACH}s"
  # -max_len bounds one input (a config file or a receive buffer's worth);
  # -rss_limit_mb keeps a leak or blow-up from taking the machine.
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  if "$OUT/$t" "${dict[@]}" -max_total_time="$SECONDS_EACH" -max_len=20000 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$OUT/artifacts/$t-" "$work" "$seeds" >"$OUT/$t.log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$OUT/$t.log" | tail -1)
    echo "$t: ${execs:-?} executions in ${SECONDS_EACH}s, $cov, corpus $(ls "$work" | wc -l) inputs"
  else
    echo "$t: FAILED (input saved under $OUT/artifacts/, if it found one; log: $OUT/$t.log)"
    tail -30 "$OUT/$t.log" || true
    failed=1
  fi
done
exit $failed
