#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A route's cost (issue 20): three brokers in a full mesh of RDMA routes, in
# one Soft-RoCE guest boot (docs/cluster.md):
#   - 1 -> 1 at 64 B, publisher and subscriber on broker A, against the
#     publisher on A and the subscriber on C (one route between them):
#     flat-out rate (median of RUNS) and p50/p99 latency at a light rate;
#   - fan-out 1 -> 30 at 64 B: the 30 subscribers on A, against 10 on each
#     of A, B and C.
# Every figure comes from `rdmabroker bench` (--sub-server puts the
# subscribers on other brokers than the publisher's -s). Writes the tables to
# stdout and into docs/benchmarks.md (its cluster section, with the date and
# commit), the reports to build/cluster-*.json and the brokers' logs to
# build/cluster-{a,b,c}.log.
#   sudo tests/bench/cluster.sh [COUNT] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-100000}
RUNS=${2:-3}
BIN=${RDMABROKER_BIN:-build/release}
# shellcheck source=tests/bench/suite-lib.sh
. tests/bench/suite-lib.sh
in_guest_unless_rdma tests/bench/cluster.sh "$COUNT" "$RUNS"
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
CLI="$BIN/client-lib/rdmabroker"
DIR=$(mktemp -d /tmp/bench-cluster.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

# Brokers a, b, c on RDMA ports 7510/7512/7514 (TCP +1), each routing to all three.
ROUTES="[rdma://$A1:7510, rdma://$A1:7512, rdma://$A1:7514]"
port=7510
for name in a b c; do
  cat >"$DIR/$name.yaml" <<YAML
listen: {rdma: 0.0.0.0:$port, tcp: 0.0.0.0:$((port + 1))}
workers: 2
metrics: {listen: ""}
admin: {socket: $DIR/$name.sock}
logging: {level: warn}
auth: {anonymous: true}
cluster: {name: bench, user: route, password: bench-route-secret, routes: $ROUTES}
YAML
  # Their logs (route warnings at shutdown among them) stay out of the report.
  "$BIN/daemon/rdmabrokerd" --config "$DIR/$name.yaml" >"build/cluster-$name.log" 2>&1 &
  PIDS+=($!)
  port=$((port + 2))
done
for name in a b c; do
  for _ in $(seq 300); do
    up=$("$CLI" stat --json --admin-socket "$DIR/$name.sock" 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["stats"].get("cluster.routes_up", 0))' 2>/dev/null || echo 0)
    [ "$up" = 2 ] && break
    sleep 0.2
  done
  [ "$up" = 2 ] || { echo "cluster.sh: broker $name has $up of 2 routes up" >&2; exit 1; }
done
URL_A="rdma://$A1:7510" URL_B="rdma://$A1:7512" URL_C="rdma://$A1:7514"

# The packets the guest's Soft-RoCE devices sent, all of them.
device_packets() {
  local n=0 f
  for f in /sys/class/infiniband/*/ports/*/hw_counters/sent_pkts; do
    [ -r "$f" ] && n=$((n + $(cat "$f")))
  done
  echo "$n"
}
# The guest's CPU ticks: user+nice, system, softirq (/proc/stat).
guest_ticks() { awk '/^cpu /{print $2 + $3, $4, $8}' /proc/stat; }
# bench NAME ARGS...: one run, its JSON report in build/cluster-NAME.json,
# the CPU seconds each broker spent in it in build/cluster-NAME.cpu, and
# the device packets and the guest's CPU split in build/cluster-NAME.dev.
bench() {
  local name=$1 before=() i=0 pkts ticks
  shift
  for p in "${PIDS[@]}"; do before+=("$(cpu_ticks "$p")"); done
  pkts=$(device_packets)
  ticks=$(guest_ticks)
  "$CLI" bench -b "$A2" --size 64 --quiet --json "$@" >"build/cluster-$name.json" ||
    echo "cluster.sh: run $name failed (exit $?)" >&2
  for p in "${PIDS[@]}"; do
    echo "$(( $(cpu_ticks "$p") - before[i] ))"
    i=$((i + 1))
  done | paste -sd' ' >"build/cluster-$name.cpu"
  echo "$(( $(device_packets) - pkts )) $ticks $(guest_ticks)" >"build/cluster-$name.dev"
}
for i in $(seq "$RUNS"); do
  bench "rate-one-$i" c.rate -s "$URL_A" -n "$COUNT"
  bench "rate-route-$i" c.rate -s "$URL_A" --sub-server "$URL_C" -n "$COUNT"
done
bench lat-one c.lat -s "$URL_A" -r 200 -d 10
bench lat-route c.lat -s "$URL_A" --sub-server "$URL_C" -r 200 -d 10
bench fan-one c.fan -s "$URL_A" -m 30 -n $((COUNT / 10))
bench fan-spread c.fan -s "$URL_A" --sub-server "$URL_A,$URL_B,$URL_C" -m 30 -n $((COUNT / 10))

python3 - "$COUNT" "$RUNS" "$(uname -r)" >build/cluster-table.md <<'PY'
import json, statistics, sys
count, runs, kernel = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def agg(name):
    try:
        return json.load(open(f"build/cluster-{name}.json"))["aggregate"]
    except (OSError, ValueError, KeyError):
        return None
def rate(kind):
    vals = [a["delivery_msgs_per_s"] for i in range(1, runs + 1) if (a := agg(f"rate-{kind}-{i}")) and a["lost"] == 0]
    return (statistics.median(vals) if vals else None), vals
one, one_runs = rate("one")
route, route_runs = rate("route")
def p(name, q):
    a = agg(name)
    return a["latency"][q] if a and a.get("latency") else None
fmt = lambda v: "n/a" if v is None else f"{v:,.0f}"
ratio = lambda a, b: "n/a" if a is None or b in (None, 0) else f"{a / b:.2f}"
print(f"3 brokers, full mesh of RDMA routes, 64 B ({kernel}); rates: {count} messages, median of {runs} runs")
print()
print("| what | one broker (pub and sub on A) | across a route (pub on A, sub on C) | route / one |")
print("|---|---:|---:|---:|")
print(f"| 1 → 1 flat out, msg/s (runs) | {fmt(one)} ({', '.join(fmt(v) for v in one_runs)}) | "
      f"{fmt(route)} ({', '.join(fmt(v) for v in route_runs)}) | **{ratio(route, one)}** |")
for q in ("p50_us", "p99_us"):
    print(f"| 1 → 1 at 200 msg/s, {q[:3]} µs | {fmt(p('lat-one', q))} | {fmt(p('lat-route', q))} | "
          f"**{ratio(p('lat-route', q), p('lat-one', q))}** |")
f1, f3 = agg("fan-one"), agg("fan-spread")
def fan(a):
    return None if not a else a["delivery_msgs_per_s"]
print(f"| 1 → 30 deliveries/s: 30 on A / 10 on each of A, B, C | {fmt(fan(f1))} | {fmt(fan(f3))} | {ratio(fan(f3), fan(f1))} |")
tck = __import__("os").sysconf("SC_CLK_TCK")
def cpu(name):
    try:
        ticks = [int(t) for t in open(f"build/cluster-{name}.cpu").read().split()]
    except (OSError, ValueError):
        return "n/a"
    return " / ".join(f"{t / tck:.1f}" for t in ticks)
print()
print("CPU seconds of brokers A / B / C during each rate run (2 vCPUs shared by the three brokers and the bench):")
print()
print("| run | one broker | across a route |")
print("|---|---|---|")
for i in range(1, runs + 1):
    print(f"| {i} | {cpu(f'rate-one-{i}')} | {cpu(f'rate-route-{i}')} |")
def dev(name):
    # Device packets per message, and the guest's CPU seconds (user, system, softirq).
    try:
        v = [int(x) for x in open(f"build/cluster-{name}.dev").read().split()]
    except (OSError, ValueError):
        return "n/a", "n/a"
    pkts, before, after = v[0], v[1:4], v[4:7]
    split = " / ".join(f"{(b - a) / tck:.1f}" for a, b in zip(before, after))
    return f"{pkts / count:.2f}", split
print()
print("Where a rate run's time goes in the guest: packets its Soft-RoCE devices sent per message, and the "
      "guest's CPU seconds as user / system / softirq (the emulated device's work is the kernel's):")
print()
print("| run | one broker: packets/msg | CPU s | across a route: packets/msg | CPU s |")
print("|---|---:|---|---:|---|")
for i in range(1, runs + 1):
    o, r = dev(f"rate-one-{i}"), dev(f"rate-route-{i}")
    print(f"| {i} | {o[0]} | {o[1]} | {r[0]} | {r[1]} |")
for name, a in (("fan-one", f1), ("fan-spread", f3)):
    if a and a["lost"]:
        print(f"\n{name}: {a['lost']} lost")
PY
cat build/cluster-table.md
tests/bench/docs_section.py cluster build/cluster-table.md
