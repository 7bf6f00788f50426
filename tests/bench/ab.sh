#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two builds of rdmabroker against each other over RDMA in one Soft-RoCE guest
# boot: for a change that must not alter performance (a restructuring), or
# one that should. Each case runs `rdmabroker bench` against each build's
# broker with that build's CLI, alternating A, B, A, B, ... so that the
# emulated machine's drift falls on both; the report gives each build's
# median and B / A. Raw perftest is not needed: both sides share the device.
#   sudo tests/bench/ab.sh BIN_A BIN_B [ROUNDS [PATTERN]]
# ROUNDS defaults to 3; PATTERN (grep -E) keeps only the cases it matches.
# e.g. a build of the commit before a change:
#   git worktree add /tmp/before REV && scripts/build.sh /tmp/before/build -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   sudo tests/bench/ab.sh /tmp/before/build build/release
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: tests/bench/ab.sh BIN_A BIN_B [ROUNDS [PATTERN]]" >&2; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3} PATTERN=${4:-.}
if [ "${RDMABROKER_GUEST:-}" != 1 ] && ! ibv_devices 2>/dev/null | grep -q -e rxe -e mlx; then
  for bin in "$A" "$B"; do ninja -C "$bin" rdmabrokerd rdmabroker_cli >/dev/null; done
  exec tests/softroce/run-in-guest.sh tests/bench/ab.sh "$A" "$B" "$ROUNDS" "$PATTERN"
fi
# The broker's address and the clients' (on an RDMA host: set them to two
# addresses of RDMA-capable interfaces).
A1=${RDMABROKER_GUEST_ADDR1:?set it to the address the broker listens on}
A2=${RDMABROKER_GUEST_ADDR2:?set it to the address the clients bind}
BIN=$A
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh
SOCK=/tmp/bench-ab.sock
OUT=$(mktemp -d)

# name | bench arguments [| more broker flags]; every broker has the suite's flags.
CASES=(
  "rate 64 B 1->1|--size 64 -n 100000"
  "rate 64 B 1->1, one broker worker|--size 64 -n 100000|--workers 1"
  "rate 16 KiB 1->1|--size 16384 -n 2000"
  "fan-out 64 B 1->4|--size 64 -p 1 -m 4 -n 30000"
  "fan-out 64 B 1->32|--size 64 -p 1 -m 32 -n 5000"
  "fan-out 64 B 1->32, the suite's count|--size 64 -p 1 -m 32 -n 50000"
  "latency 64 B at 200 msg/s|--size 64 -r 200 -d 5"
)
mapfile -t CASES < <(printf '%s\n' "${CASES[@]}" | grep -E -- "$PATTERN")
[ ${#CASES[@]} -gt 0 ] || { echo "ab: no case matches $PATTERN" >&2; exit 2; }

# run_case BIN INDEX ROUND: one bench run; its JSON in OUT, with the broker's
# CPU seconds over the run (the steadier number when the rate is noisy).
run_case() {
  local bin=$1 i=$2 round=$3 args broker_args=() c0 file
  IFS='|' read -r _ args extra <<<"${CASES[$i]}"
  # shellcheck disable=SC2206
  [ -n "${extra:-}" ] && broker_args=($extra)
  BIN=$bin
  start_broker --port 7495 --buffer-size 32768 --pool-buffers 8192 "${broker_args[@]}"
  file="$OUT/$i-$([ "$bin" = "$A" ] && echo a || echo b)-$round"
  c0=$(cpu_ticks "$BROKER")
  # shellcheck disable=SC2086
  "$bin/client-lib/rdmabroker" bench -s "rdma://$A1:7495" -b "$A2" $args --json --quiet \
    >"$file.json" 2>"$OUT/err" || true
  echo "$(( $(cpu_ticks "$BROKER") - c0 )) $(getconf CLK_TCK)" >"$file.cpu"
  stop_broker
}

for round in $(seq "$ROUNDS"); do
  for i in "${!CASES[@]}"; do
    run_case "$A" "$i" "$round"
    run_case "$B" "$i" "$round"
  done
  echo "ab: round $round of $ROUNDS done ($SECONDS s)"
done

python3 - "$OUT" "$A" "$B" "${#CASES[@]}" "${CASES[@]%%|*}" <<'EOF'
import json, os, statistics, sys
out, a, b, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
names = sys.argv[5:5 + n]

def value(path, latency):
    """(rate or p50, broker CPU us per delivered message), or None if the run failed."""
    try:
        r = json.load(open(path + ".json"))
        ticks, hz = (int(x) for x in open(path + ".cpu").read().split())
    except (OSError, ValueError):
        return None
    agg = r["aggregate"]
    if agg.get("lost", 0) or any(s.get("error") for s in r["subscribers"]) or not agg["received"]:
        return None
    cpu_us = ticks / hz * 1e6 / agg["received"]
    if latency:
        return agg["latency_from_send"]["p50_us"], cpu_us  # from the publish call
    return agg["delivery_msgs_per_s"], cpu_us

print(f"| case | A: {a} | B: {b} | B / A | broker CPU µs/msg A / B | runs (A; B) |")
print("|---|---|---|---|---|---|")
for i, name in enumerate(names):
    latency = name.startswith("latency")
    runs = {}
    for side in "ab":
        stems = sorted({f.rsplit(".", 1)[0] for f in os.listdir(out) if f.startswith(f"{i}-{side}-")})
        runs[side] = [value(os.path.join(out, f), latency) for f in stems]
    ok = {s: [v for v in runs[s] if v is not None] for s in "ab"}
    med = {s: statistics.median(v[0] for v in ok[s]) if ok[s] else None for s in "ab"}
    cpu = {s: statistics.median(v[1] for v in ok[s]) if ok[s] else None for s in "ab"}
    unit = "p50 µs" if latency else "msg/s"
    ratio = f"{med['b'] / med['a']:.2f}" if med["a"] and med["b"] else "n/a"
    fmt = lambda v: "failed" if v is None else f"{v:,.0f}" if not latency else f"{v:,.1f}"
    fcpu = lambda v: "n/a" if v is None else f"{v:.1f}"
    print(f"| {name} ({unit}) | {fmt(med['a'])} | {fmt(med['b'])} | {ratio} | {fcpu(cpu['a'])} / {fcpu(cpu['b'])} | "
          f"{', '.join(fmt(v and v[0]) for v in runs['a'])}; {', '.join(fmt(v and v[0]) for v in runs['b'])} |")
EOF
rm -rf "$OUT"
