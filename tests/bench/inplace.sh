#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What reading a message in place saves (issue 16's zero-copy delivery):
# `rdmabroker bench` with the subscriber reading each payload in place
# (subscribe_view, the default) against the same run with --copy (an owning
# Message per message, what a `subscribe` handler gets), alternating copy,
# in place, copy, ... on one broker serving RDMA and TCP, 1 -> 1, 64 B and
# 16 KiB, flat out. Reports each mode's median delivered rate and the bench
# process's CPU (user + system, publisher and subscriber together) per
# delivered message, and every run; the table goes into docs/benchmarks.md's
# section inplace-guest-ROUNDS or inplace-host-ROUNDS (doc_table, suite-lib.sh).
# Runs where RDMA devices exist; without one, through the Soft-RoCE guest:
#   sudo tests/bench/inplace.sh [ROUNDS]
# TCP only, on this host (SCALE multiplies the messages per run):
#   HOST=1 RDMABROKER_GUEST=1 RDMABROKER_GUEST_ADDR1=127.0.0.1 RDMABROKER_GUEST_ADDR2=127.0.0.1 \
#     SCALE=10 tests/bench/inplace.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/inplace.sh "$ROUNDS"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
SOCK=/tmp/bench-inplace.sock
CLI="$BIN/client-lib/rdmabroker"
broker_on_both_transports 7493 7494

WHERE=$([ "${HOST:-0}" = 1 ] && echo host || echo guest)
python3 - "$CLI" "$ROUNDS" "$A2" "${SCALE:-1}" "${URLS[@]}" <<'EOF' | doc_table "inplace-$WHERE-$ROUNDS"
import json, os, resource, statistics, subprocess, sys
cli, rounds, bind, scale, urls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
# Messages per run: a few seconds each under emulation.
counts = {("rdma", 64): 50000, ("rdma", 16384): 2000, ("tcp", 64): 100000, ("tcp", 16384): 5000}
counts = {k: v * scale for k, v in counts.items()}
rows = []
for url in urls:
    transport = url.split(":")[0]
    for size in (64, 16384):
        runs = {"copy": [], "in place": []}
        for r in range(rounds):
            for mode in ("copy", "in place"):
                cmd = [cli, "bench", "ip", "-s", url, "--size", str(size), "-n", str(counts[(transport, size)]),
                       "--quiet", "--json"]
                if transport == "rdma":
                    cmd += ["-b", bind]
                if mode == "copy":
                    cmd.append("--copy")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                a = json.loads(out)["aggregate"]
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                runs[mode].append((a["delivery_msgs_per_s"], cpu * 1e6 / max(a["received"], 1)))
                print(f"{transport} {size} B round {r + 1} {mode}: {a['delivery_msgs_per_s']:,.0f} msg/s, "
                      f"{runs[mode][-1][1]:.2f} us CPU/msg", file=sys.stderr)
        med = {m: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for m, v in runs.items()}
        rows.append((transport, size, med, runs))

print(f"1 → 1 flat out, medians of {rounds} rounds (copy, in place, alternating), {os.cpu_count()} CPUs, "
      f"kernel {os.uname().release}")
print()
print(f"| transport, size | copy: msg/s | in place: msg/s | ratio | copy: µs CPU/msg | in place: µs CPU/msg | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
for transport, size, med, runs in rows:
    c, v = med["copy"], med["in place"]
    print(f"| {transport}, {size} B | {c[0]:,.0f} | {v[0]:,.0f} | {v[0] / c[0]:.2f} | {c[1]:.2f} | {v[1]:.2f} "
          f"| {v[1] / c[1]:.2f} |")
print()
for transport, size, med, runs in rows:
    for mode, v in runs.items():
        print(f"- {transport} {size} B {mode}: " + ", ".join(f"{r:,.0f} msg/s {c:.2f} µs" for r, c in v))
EOF
