#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What message headers cost, on one broker in one guest boot, over RDMA and
# TCP: `rdmabroker bench` (1 publisher -> 1 subscriber flat out, N messages)
# with a 64 B payload and no headers, with two headers (Trace-Id and
# Content-Type: a 64-byte header block), and with a 128 B payload and no
# headers (the same bytes on the wire as the second). The broker forwards a
# block like payload bytes, so the second and third should cost the same in
# the broker; what is left between them is the libraries' (checking and
# writing the block, parsing it into Message::headers).
#   tests/bench/headers.sh [N]          in the guest: RDMA and TCP
#   tests/bench/headers.sh --host [N]   on this host's real CPUs: TCP on loopback
# Prints one markdown table, written into docs/benchmarks.md's section
# headers-guest-N or headers-host-N when it has one (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
HOST=0
[ "${1:-}" = --host ] && { HOST=1; shift; }
N=${1:-200000}
BIN=${RDMABROKER_BIN:-build/release}
source tests/bench/suite-lib.sh
[ "$HOST" = 1 ] || in_guest_unless_rdma "$0" "$@"
A1=${RDMABROKER_GUEST_ADDR1:-127.0.0.1}
A2=${RDMABROKER_GUEST_ADDR2:-127.0.0.1}
SOCK=/tmp/headers-bench-$$.sock
broker_on_both_transports 7484 7485
HEADERS=(-H Trace-Id=4bf92f3577b34da6 -H Content-Type=application/json)  # 28 + 32 bytes of lines: a 64-byte block
OUT=$(mktemp -d)
trap 'stop_broker; rm -rf "$OUT"' EXIT
for url in "${URLS[@]}"; do
  scheme=${url%%:*}
  # Interleaved, twice: a drift of the emulated CPUs during the run hits all three alike.
  for round in 1 2; do
    "$BIN/client-lib/rdmabroker" bench bench.h -s "$url" -b "$A2" -n "$N" --size 64 --json --quiet \
      >"$OUT/$scheme-plain64-$round.json"
    "$BIN/client-lib/rdmabroker" bench bench.h -s "$url" -b "$A2" -n "$N" --size 64 --json --quiet "${HEADERS[@]}" \
      >"$OUT/$scheme-headers64-$round.json"
    "$BIN/client-lib/rdmabroker" bench bench.h -s "$url" -b "$A2" -n "$N" --size 128 --json --quiet \
      >"$OUT/$scheme-plain128-$round.json"
  done
done
STATS=$("$BIN/client-lib/rdmabroker" stat --json --admin-socket "$SOCK")
WHERE=$([ "$HOST" = 1 ] && echo host || echo guest)
/usr/bin/python3 - "$OUT" "$HOST" "$STATS" "$N" "${URLS[@]}" <<'EOF' | doc_table "headers-$WHERE-$N"
import json, os, sys
out, host, stats, n, urls = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
where = "host loopback" if host else f"Soft-RoCE guest ({os.uname().release})"
print(f"{n:,} messages per run, {where}, {os.cpu_count()} CPUs; none lost.")
print()
def best(scheme, kind):
    runs = [json.load(open(os.path.join(out, f"{scheme}-{kind}-{r}.json")))["aggregate"] for r in (1, 2)]
    for a in runs:
        if a["lost"] != 0:
            sys.exit(f"headers.sh: {scheme} {kind} lost {a['lost']} messages")
    return max(a["delivery_msgs_per_s"] for a in runs)
print("| 1 → 1 flat out, msg/s delivered (best of 2) | 64 B | 64 B + 2 headers (64-byte block) | 128 B | headers / 64 B | headers / 128 B |")
print("|---|---:|---:|---:|---:|---:|")
for url in urls:
    s = url.split(":")[0]
    p64, h64, p128 = best(s, "plain64"), best(s, "headers64"), best(s, "plain128")
    print(f"| {s.upper()} | {p64:,.0f} | {h64:,.0f} | {p128:,.0f} | {h64 / p64:.2f} | {h64 / p128:.2f} |")
c = stats.get("stats", stats)
print(f"\nbroker: messages.in {c.get('messages.in')}, messages.headers_stripped {c.get('messages.headers_stripped')}")
EOF
