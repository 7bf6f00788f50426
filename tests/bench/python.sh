#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the Python package costs against the C++ library, on one broker in one
# guest boot, over RDMA and over TCP: `rdmabroker bench` (1 publisher -> 1
# subscriber, N messages of 64 B flat out) and python/examples/bench.py (the
# same with the Python package: a callback subscriber).
#   tests/bench/python.sh [N]          in the guest: RDMA and TCP
#   tests/bench/python.sh --host [N]   on this host's real CPUs: TCP on loopback
# The guest's emulated CPUs make every hand-off of Python's GIL between the
# publishing thread and the library's delivering thread cost a wake-up of
# hundreds of microseconds: there, read the ratio; the host says what Python
# costs on a real CPU. The table goes into docs/benchmarks.md's section
# python-guest-N or python-host-N when it has one (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
HOST=0
[ "${1:-}" = --host ] && { HOST=1; shift; }
N=${1:-50000}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
[ "$HOST" = 1 ] || in_guest_unless_rdma "$0" "$@"
A1=${RDMABROKER_GUEST_ADDR1:-127.0.0.1}
A2=${RDMABROKER_GUEST_ADDR2:-127.0.0.1}
SOCK=/tmp/python-bench-$$.sock
broker_on_both_transports 7482 7483
export PYTHONPATH=$PWD/python RDMABROKER_LIBRARY=$PWD/$BIN/client-lib/librdmabroker.so.0
WHERE=$([ "$HOST" = 1 ] && echo "host" || echo "guest")
{
  echo "1 → 1 flat out, $N messages of 64 B, the $WHERE ($(uname -r), $(nproc) CPUs)"
  echo
  echo "| transport | C++ delivered | Python delivered (published) | Python / C++ |"
  echo "|---|---:|---:|---:|"
  for url in "${URLS[@]}"; do
    cli=$("$BIN/client-lib/rdmabroker" bench bench.cli -s "$url" -b "$A2" -n "$N" --size 64 --json --quiet)
    py=$(/usr/bin/python3 python/examples/bench.py "$url" --bind "$A2" -n "$N" --size 64)
    /usr/bin/python3 - "$url" "$cli" "$py" <<'EOF'
import json, sys
url, cli, py = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
c = cli["aggregate"]["delivery_msgs_per_s"]
p = py["delivery_msgs_per_s"]
print(f"| {url.split(':')[0].upper()} | {c:,.0f} msg/s | {p:,.0f} msg/s ({py['publish_msgs_per_s']:,.0f}/s) | {p / c:.2f}× |")
EOF
  done
} | doc_table "python-$WHERE-$N"
