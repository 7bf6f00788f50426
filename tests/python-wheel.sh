#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package as pip users get it (ctest Python.WheelInstallsIntoAFreshVenv):
# builds a wheel from a copy of python/ (offline: the build backend is
# Debian's setuptools, no build isolation), installs it into a new venv with
# no index, then, from outside the source tree, checks the version against
# the project's, publishes and receives one message through a broker over TCP,
# and checks that a library that cannot be loaded gives an ImportError naming
# it, RDMABROKER_LIBRARY and the Debian package.
#   tests/python-wheel.sh   (RDMABROKER_LIBRARY, RDMABROKERD set by CMake)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/rdmabroker-wheel.XXXXXX)
broker=
cleanup() {
  [ -z "$broker" ] || kill "$broker" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cp -r "$src/python" "$work/src"
rm -rf "$work/src/tests" "$work/src/examples"
/usr/bin/python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/rdmabroker-*.whl)
echo "python-wheel: built $(basename "$wheel")"
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index "$wheel"
cd "$work"
want=$(sed -n 's/^project(rdmabroker VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
got=$(PYTHONPATH= "$work/venv/bin/python" -c 'import rdmabroker; print(rdmabroker.__version__)')
[ "$got" = "$want" ] || { echo "python-wheel: __version__ $got, project $want" >&2; exit 1; }
meta=$(ls -d "$work"/venv/lib/python3*/site-packages/rdmabroker-*.dist-info)/METADATA
grep -q '^License: Apache-2.0' "$meta" || { echo "python-wheel: no licence in $meta" >&2; exit 1; }

# The broker's port: from a block of the test ports' lock files, below the
# kernel's ephemeral range, held while this script runs (as the C++ and
# Python tests take theirs: tests/rdma/harness.cpp, claim_port_block). A
# port that was merely free when probed could be taken, before the broker
# bound it, by a client socket of a test running beside this one.
mkdir -p /tmp/rdmabroker-test-ports
port=
for i in $(seq 0 999); do
  block=$((($$ + i) % 1000))
  exec {lock}>>"/tmp/rdmabroker-test-ports/$block"
  if flock -n "$lock"; then
    port=$((10000 + block * 20))
    break
  fi
  exec {lock}>&-
done
[ -n "$port" ] || { echo "python-wheel: no free port block in /tmp/rdmabroker-test-ports" >&2; exit 1; }
"$RDMABROKERD" --allow-anonymous --tcp-port "$port" --admin-socket "$work/admin.sock" --metrics-listen "" \
  --log-level warn &
broker=$!
PYTHONPATH= "$work/venv/bin/python" - "$port" <<'PY'
import sys, time
import rdmabroker
url = f"tcp://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 20
while True:
    try:
        c = rdmabroker.connect(url)
        break
    except rdmabroker.ConnectFailed:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
with c:
    sub = c.subscribe("wheel.test")
    c.flush()
    c.publish("wheel.test", b"from a wheel")
    m = sub.next(timeout=10)
    assert m.data == b"from a wheel", m.data
print("python-wheel: published and received through the installed package")
PY

out=$(RDMABROKER_LIBRARY=/nonexistent/librdmabroker.so.0 PYTHONPATH= "$work/venv/bin/python" -c 'import rdmabroker' 2>&1) &&
  { echo "python-wheel: import succeeded without a library" >&2; exit 1; }
for want in ImportError "RDMABROKER_LIBRARY=/nonexistent/librdmabroker.so.0" librdmabroker0; do
  grep -qF -- "$want" <<<"$out" || { echo "python-wheel: the import error does not say '$want':" >&2; echo "$out" >&2; exit 1; }
done
echo "python-wheel: ok"
