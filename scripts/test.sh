#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this):
#   1. installs what is missing (Debian packages), builds three trees:
#      release, ASan+UBSan, TSan;
#   2. builds and checks the .deb (scripts/package.sh), runs the unit tests
#      and the TCP integration tests of each tree on the host;
#   3. boots the Soft-RoCE guest once and runs the RDMA integration tests
#      of every tree inside it (tests/softroce/guest-suite.sh);
#   4. boots it once more with systemd as PID 1, installs the .deb and drives
#      the real unit (tests/softroce/systemd-suite.sh);
#   5. fuzzes each libFuzzer target (tests/fuzz/run.sh) for
#      RDMABROKER_FUZZ_SECONDS (default 60, 0 skips) after replaying the
#      committed seed corpus and regressions;
#   6. runs the benchmark suite in --quick mode (tests/bench/suite.sh): not
#      to measure anything, but so that the suite, the NATS and Redis drivers
#      and the report keep working; it fails if a run fails or loses a
#      message (RDMABROKER_TEST_BENCH=0 skips it).
# RDMA tests never skip: no guest or no RDMA device is a failure.
# Set RDMABROKER_TEST_TREES to a subset (e.g. "release") for a quicker run.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
scripts/install-deps.sh

TREES=${RDMABROKER_TEST_TREES:-release asan tsan}
for t in $TREES; do
  case $t in
    release) args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
    asan) args=(-DCMAKE_BUILD_TYPE=Debug -DRDMABROKER_SANITIZE=address -DRDMABROKER_FAULT_INJECTION=ON) ;;
    tsan) args=(-DCMAKE_BUILD_TYPE=Debug -DRDMABROKER_SANITIZE=thread -DRDMABROKER_FAULT_INJECTION=ON) ;;
    *) echo "test.sh: unknown tree $t" >&2; exit 2 ;;
  esac
  echo "=== build $t"
  scripts/build.sh "build/$t" "${args[@]}"
done

failed=0
if [[ " $TREES " == *" release "* ]]; then
  echo "=== package (build/release)"
  DEB=$(scripts/package.sh build/release | tail -1) || failed=1
fi
for t in $TREES; do
  echo "=== unit and TCP integration tests ($t, host)"
  ctest --test-dir "build/$t" -L 'unit|tcp' --output-on-failure || failed=1
done

if [ "${RDMABROKER_FUZZ_SECONDS:-60}" != 0 ]; then
  echo "=== fuzzing (libFuzzer, ASan+UBSan): ${RDMABROKER_FUZZ_SECONDS:-60} s per target"
  tests/fuzz/run.sh "${RDMABROKER_FUZZ_SECONDS:-60}" || failed=1
fi

echo "=== RDMA integration tests (Soft-RoCE guest): $TREES"
dirs=()
for t in $TREES; do dirs+=("build/$t"); done
tests/softroce/run-in-guest.sh tests/softroce/guest-suite.sh "${dirs[@]}" || failed=1

if [ -n "${DEB:-}" ]; then
  echo "=== systemd unit (Soft-RoCE guest booted with systemd as PID 1): $DEB"
  RDMABROKER_GUEST_INIT=systemd tests/softroce/run-in-guest.sh tests/softroce/systemd-suite.sh "$DEB" || failed=1
fi

if [[ " $TREES " == *" release "* ]] && [ "${RDMABROKER_TEST_BENCH:-1}" = 1 ]; then
  echo "=== benchmark suite, quick (machinery only; numbers in docs/benchmarks.md come from a full run)"
  tests/bench/suite.sh --quick || failed=1
fi

echo "=== test.sh: $(( $(date +%s) - T0 )) s, $([ $failed = 0 ] && echo PASSED || echo FAILED)"
exit $failed
