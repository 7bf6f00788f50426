#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What TLS costs, in one run on this host's loopback: rdmabroker over plain
# TCP and over TLS (one broker, tls.mode: optional, so both on one port), and
# nats-server without and with TLS (two servers), each driven by the same
# measurement (`rdmabroker bench` and tests/bench/drivers/nats_bench):
# 1 publisher -> 1 subscriber flat out at 64 B, 1 KiB and 16 KiB, and the
# latency at a light fixed rate (1,000 msg/s, 64 B). Every TLS connection
# verifies the server's certificate (a CA made here with the openssl CLI).
#   tests/bench/tls.sh [N]    N messages at 64 B (fewer at larger sizes)
# Prints one markdown table, written into docs/benchmarks.md's section tls-N
# when it has one (doc_table, suite-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/bench/suite-lib.sh
source tests/bench/suite-lib.sh
N=${1:-1000000}
BIN=${RDMABROKER_BIN:-build/release}
[ -x "$BIN/tests/bench/drivers/nats_bench" ] || scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
command -v nats-server >/dev/null || { echo "tls.sh: needs nats-server (scripts/install-deps.sh --bench)" >&2; exit 2; }
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
(
  cd "$DIR"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
  openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj "/CN=bench CA" 2>/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server.key 2>/dev/null
  openssl req -new -key server.key -out server.csr -subj "/CN=bench" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 \
    -extfile server.ext 2>/dev/null
)
BASE=$((21000 + $$ % 4000))
RB=$BASE NATS=$((BASE + 1)) NATS_TLS=$((BASE + 2))
cat >"$DIR/broker.yaml" <<EOF
tls:
  mode: optional
  certificate: $DIR/server.crt
  key: $DIR/server.key
EOF
# 32 KiB buffers, as the benchmark suite's: a 16 KiB payload fits one frame.
"$BIN/daemon/rdmabrokerd" --config "$DIR/broker.yaml" --rdma off --tcp-port "$RB" --admin-socket "$DIR/admin.sock" \
  --metrics-listen "" --workers 2 --allow-anonymous --log-level warn --buffer-size 32768 &
PIDS+=($!)
nats-server -a 127.0.0.1 -p "$NATS" >"$DIR/nats.log" 2>&1 &
PIDS+=($!)
nats-server -a 127.0.0.1 -p "$NATS_TLS" --tls --tlscert "$DIR/server.crt" --tlskey "$DIR/server.key" \
  >"$DIR/nats-tls.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  [ -S "$DIR/admin.sock" ] && (exec 3<>"/dev/tcp/127.0.0.1/$NATS") 2>/dev/null &&
    (exec 3<>"/dev/tcp/127.0.0.1/$NATS_TLS") 2>/dev/null && break
  sleep 0.1
done
export RDMABROKER_TLS_CA=$DIR/ca.crt  # both benches trust the CA through it
# run SYSTEM URL ARGS...: one bench, its aggregate as JSON.
run() {
  local system=$1 url=$2
  shift 2
  if [ "$system" = rdmabroker ]; then
    "$BIN/client-lib/rdmabroker" bench tls.bench -s "$url" --json --quiet "$@"
  else
    "$BIN/tests/bench/drivers/nats_bench" tls.bench -s "$url" --json --quiet "$@"
  fi
}
RESULTS=$DIR/results
: >"$RESULTS"
i=0
# record SYSTEM URL SIZE KIND ARGS...: one run, its JSON in a file named in $RESULTS.
record() {
  local system=$1 url=$2 size=$3 kind=$4
  shift 4
  i=$((i + 1))
  run "$system" "$url" --size "$size" "$@" >"$DIR/run-$i.json"
  echo "$system ${url%%:*} $size $kind $DIR/run-$i.json" >>"$RESULTS"
}
for size in 64 1024 16384; do
  n=$((size == 64 ? N : size == 1024 ? N / 2 : N / 10))
  for target in "rdmabroker tcp://127.0.0.1:$RB" "rdmabroker tls://127.0.0.1:$RB" \
                "nats nats://127.0.0.1:$NATS" "nats tls://127.0.0.1:$NATS_TLS"; do
    read -r system url <<<"$target"
    record "$system" "$url" "$size" rate -n "$n"
  done
done
for target in "rdmabroker tcp://127.0.0.1:$RB" "rdmabroker tls://127.0.0.1:$RB" \
              "nats nats://127.0.0.1:$NATS" "nats tls://127.0.0.1:$NATS_TLS"; do
  read -r system url <<<"$target"
  record "$system" "$url" 64 light -r 1000 -d 3
done
STATS=$("$BIN/client-lib/rdmabroker" stat --json --admin-socket "$DIR/admin.sock")
/usr/bin/python3 - "$RESULTS" "$STATS" "$N" "$(nats-server --version)" <<'PYEOF' | doc_table "tls-$N"
import json, os, sys
rows = {}
for line in open(sys.argv[1]):
    system, scheme, size, kind, path = line.split()
    a = json.load(open(path))["aggregate"]
    if a["lost"] != 0:
        sys.exit(f"tls.sh: {system} {scheme} {size} {kind} lost {a['lost']} messages")
    rows[(system, "plain" if scheme in ("tcp", "nats") else "tls", int(size), kind)] = a
n = int(sys.argv[3])
print(f"Host loopback, {os.cpu_count()} cores, {sys.argv[4]}; {n:,} messages at 64 B, {n // 2:,} at 1 KiB, "
      f"{n // 10:,} at 16 KiB; none lost.")
print()
def rate(s, t, size):
    a = rows[(s, t, size, "rate")]
    return a["delivery_msgs_per_s"], a["delivery_mb_per_s"]
print("| 1 → 1 flat out | rdmabroker TCP | rdmabroker TLS | TLS / TCP | NATS | NATS TLS | TLS / plain | rdmabroker TLS / NATS TLS |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for size in (64, 1024, 16384):
    (rt, rtm), (rs, rsm), (nt, ntm), (ns, nsm) = (rate("rdmabroker", "plain", size), rate("rdmabroker", "tls", size),
                                                  rate("nats", "plain", size), rate("nats", "tls", size))
    label = f"{size} B" if size < 1024 else f"{size // 1024} KiB"
    print(f"| {label} msg/s (MB/s) | {rt:,.0f} ({rtm:,.0f}) | {rs:,.0f} ({rsm:,.0f}) | {rs / rt:.2f} | "
          f"{nt:,.0f} ({ntm:,.0f}) | {ns:,.0f} ({nsm:,.0f}) | {ns / nt:.2f} | {rs / ns:.2f} |")
def lat(s, t):
    l = rows[(s, t, 64, "light")]["latency"]
    return f"{l['p50_us']:,.0f} / {l['p99_us']:,.0f}"
print(f"| 64 B at 1,000 msg/s, latency p50 / p99 µs | {lat('rdmabroker', 'plain')} | {lat('rdmabroker', 'tls')} | | "
      f"{lat('nats', 'plain')} | {lat('nats', 'tls')} | | |")
stats = json.loads(sys.argv[2])
counters = stats.get("stats", stats)
print(f"\nrdmabroker counted {counters.get('tls.handshakes')} TLS handshakes, "
      f"{sum(v for k, v in counters.items() if k.startswith('tls.handshake_failures.'))} failed.")
PYEOF
