#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as CI runs it (.ci/run calls this):
#   1. installs what is missing (Debian packages), builds three trees:
#      release, ASan+UBSan, TSan;
#   2. builds and checks the .debs (scripts/package.sh) and the container
#      image (scripts/image.sh), runs the unit tests and the TCP integration
#      tests of each tree on the host;
#   3. boots the Soft-RoCE guest once and runs the RDMA integration tests
#      of every tree inside it (tests/softroce/guest-suite.sh);
#   4. boots it once more with systemd as PID 1, installs the .debs and drives
#      the real unit (tests/softroce/systemd-suite.sh);
#   5. fuzzes each libFuzzer target (tests/fuzz/run.sh) for
#      RDMABROKER_FUZZ_SECONDS (default 20, 0 skips) after replaying the
#      committed seed corpus and regressions;
#   6. runs the benchmark suite in --quick mode (tests/bench/suite.sh): not
#      to measure anything, but so that the suite, the NATS and Redis drivers
#      and the report keep working; it fails if a run fails or loses a
#      message (RDMABROKER_TEST_BENCH=0 skips it).
# It ends with a table of each stage's seconds.
# RDMA tests never skip: no guest or no RDMA device is a failure.
# Set RDMABROKER_TEST_TREES to a subset (e.g. "release") for a quicker run.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
STAGES=()
failed=0
# stage NAME CMD...: runs CMD, records its seconds and result for the table.
stage() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  STAGES+=("$(printf '%-44s %6d s  %s' "$name" $(( $(date +%s) - start )) "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")")")
  [ $rc = 0 ] || failed=1
  return 0
}
stage_table() {
  echo "=== test.sh: stages"
  printf '%s\n' "${STAGES[@]}"
  echo "=== test.sh: $(( $(date +%s) - T0 )) s, $([ $failed = 0 ] && echo PASSED || echo FAILED)"
}

stage "install dependencies" scripts/install-deps.sh
[ $failed = 0 ] || { stage_table; exit 1; }

TREES=${RDMABROKER_TEST_TREES:-release asan tsan}
# The sanitizer trees build what the tests run, not the benchmark programs.
for t in $TREES; do
  case $t in
    release) args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
    asan) args=(-DCMAKE_BUILD_TYPE=Debug -DRDMABROKER_SANITIZE=address -DRDMABROKER_FAULT_INJECTION=ON -DRDMABROKER_BENCHMARKS=OFF) ;;
    # TSan's tree compiles one source at a time, as a user's or packager's
    # plain `cmake` build does (the README's): a unity batch lets a source
    # lean on its neighbours' includes and declarations, which such a build
    # then fails on (2026-12-02: three sources did).
    tsan) args=(-DCMAKE_BUILD_TYPE=Debug -DRDMABROKER_SANITIZE=thread -DRDMABROKER_FAULT_INJECTION=ON -DRDMABROKER_BENCHMARKS=OFF
                -DRDMABROKER_UNITY_BATCH=0) ;;
    *) echo "test.sh: unknown tree $t" >&2; exit 2 ;;
  esac
  echo "=== build $t"
  stage "build $t" scripts/build.sh "build/$t" "${args[@]}"
done
[ $failed = 0 ] || { stage_table; exit 1; }

if [[ " $TREES " == *" release "* ]]; then
  echo "=== package (build/release)"
  package() { DEBS=$(scripts/package.sh build/release | tail -1); }
  stage "package (.debs)" package
  echo "=== container image (scripts/image.sh): build, then run from its read-only root"
  stage "container image (build + smoke)" scripts/image.sh build/release
fi
for t in $TREES; do
  echo "=== unit and TCP integration tests ($t, host)"
  # Four at a time on two cores: every test process takes its own ports and
  # paths, and the TCP tests spend much of their time waiting for brokers and
  # sockets (2026-11-28: release 48 -> 26 s, ASan 80 -> 46 s, TSan 92 -> 58 s).
  stage "host tests $t (unit, tcp)" ctest --test-dir "build/$t" -L 'unit|tcp' -j 4 --output-on-failure
done

if [ "${RDMABROKER_FUZZ_SECONDS:-20}" != 0 ]; then
  echo "=== fuzzing (libFuzzer, ASan+UBSan): ${RDMABROKER_FUZZ_SECONDS:-20} s per target"
  stage "fuzz (${RDMABROKER_FUZZ_SECONDS:-20} s per target)" tests/fuzz/run.sh "${RDMABROKER_FUZZ_SECONDS:-20}"
fi

echo "=== RDMA integration tests (Soft-RoCE guest): $TREES"
dirs=()
for t in $TREES; do dirs+=("build/$t"); done
# Memory for three tests at a time, each with a broker's registered pool; the
# three trees take about 21 minutes in one boot (the harness's default bound
# is 30).
RDMABROKER_GUEST_MEM=${RDMABROKER_GUEST_MEM:-4096} RDMABROKER_GUEST_TIMEOUT=${RDMABROKER_GUEST_TIMEOUT:-2700} \
  stage "guest: rdma tests ($TREES)" tests/softroce/run-in-guest.sh tests/softroce/guest-suite.sh "${dirs[@]}"

if [ -n "${DEBS:-}" ]; then
  echo "=== systemd unit (Soft-RoCE guest booted with systemd as PID 1): $DEBS"
  # shellcheck disable=SC2086 # one argument per package
  RDMABROKER_GUEST_INIT=systemd stage "guest: systemd unit" tests/softroce/run-in-guest.sh tests/softroce/systemd-suite.sh $DEBS
fi

if [[ " $TREES " == *" release "* ]] && [ "${RDMABROKER_TEST_BENCH:-1}" = 1 ]; then
  echo "=== benchmark suite, quick (machinery only; numbers in docs/benchmarks.md come from a full run)"
  stage "benchmark suite --quick" tests/bench/suite.sh --quick
fi

stage_table
exit $failed
