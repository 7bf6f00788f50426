#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Logins and established traffic under a login flood (issue 18; docs/security.md,
# "Password guessing and connection floods"; results in docs/benchmarks.md).
#   tests/bench/login-flood.sh tcp [BIN...]    on this host: the flood from 127.0.0.2, the client from 127.0.0.1
#   tests/bench/login-flood.sh rdma [BIN...]   over RDMA (through the Soft-RoCE guest when this host has
#                                              no RDMA device): the flood from ADDR2, the client from ADDR1
# Each BIN is a build tree (default build/release; an older build to compare
# with, e.g. build/before-src/build, is run the same way in the same run).
# Per build, one broker with one user (a default-cost crypt(3) hash from
# `rdmabroker passwd`):
#   quiet: LOGINS timed logins, and a subscriber's latency at RATE msg/s;
#   flood: GUESSERS password guessers and HOLDERS connections that never send
#          CONNECT, all from the flood address, while the same logins run from
#          the other address and the same subscriber measures again;
#   after: the broker's RSS 10 s after the flood ended.
# Guesses per second are the broker's failed logins (auth.failed) over the flood.
# Environment: GUESSERS (160), HOLDERS (64), LOGINS (30), RATE (500); FIRST_ARGS: more
# broker flags for the first build only (e.g. "--auth-cache-ttl-s 0": every login pays crypt(3)).
set -euo pipefail
cd "$(dirname "$0")/../.."
VIA=${1:-tcp}
shift || true
BINS=("$@")
[ ${#BINS[@]} -gt 0 ] || BINS=(build/release)
BIN=${BINS[0]}
source tests/bench/suite-lib.sh
GUESSERS=${GUESSERS:-160}
HOLDERS=${HOLDERS:-64}
LOGINS=${LOGINS:-30}
RATE=${RATE:-500}
# The flood and the measuring client come from the first build; the others only need their broker.
# The report goes into docs/benchmarks.md's section login-flood-VIA too, when it
# has one (doc_table, suite-lib.sh).
build_all() {
  ninja -C "$BIN" login_flood rdmabrokerd rdmabroker_cli >/dev/null
  for b in "${BINS[@]:1}"; do ninja -C "$b" rdmabrokerd >/dev/null; done
}
if [ "$VIA" = rdma ] && [ "${RDMABROKER_GUEST:-}" != 1 ] && ! ibv_devices 2>/dev/null | grep -q -e rxe -e mlx; then
  build_all
  exec tests/softroce/run-in-guest.sh env GUESSERS="$GUESSERS" HOLDERS="$HOLDERS" LOGINS="$LOGINS" RATE="$RATE" \
    FIRST_ARGS="${FIRST_ARGS:-}" \
    tests/bench/login-flood.sh rdma "${BINS[@]}"
fi
[ "$VIA" = rdma ] || build_all
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FLOOD_BIN=${BINS[0]}/tests/bench/micro/login_flood  # the flood itself is the same program for every build
if [ "$VIA" = tcp ]; then
  LEGIT=127.0.0.1 FLOOD=127.0.0.2 PORT=7493 URL=tcp://127.0.0.1:7493
  TRANSPORT=(--rdma off --tcp-port 7493)
else
  LEGIT=$RDMABROKER_GUEST_ADDR1 FLOOD=$RDMABROKER_GUEST_ADDR2 PORT=7492 URL=rdma://$RDMABROKER_GUEST_ADDR1:7492
  TRANSPORT=(--port 7492 --tcp-port 0)
fi
OUT=$(mktemp -d)
SOCK=$OUT/admin.sock
PASSWORD=flood-bench-secret
HASH=$(printf '%s' "$PASSWORD" | "$BIN/client-lib/rdmabroker" passwd)
printf 'auth:\n  anonymous: false\n  users:\n    - name: alice\n      password: "%s"\nlogging: {level: warn}\n' "$HASH" >"$OUT/broker.yaml"

# "busy kernel" of /proc/stat, in ticks: every CPU's user+nice+system+irq+softirq, and
# system+irq+softirq alone (the kernel's share: rdma_cm and rxe work runs there).
kernel_busy() { awk '$1=="cpu"{print $2+$3+$4+$7+$8, $4+$7+$8}' /proc/stat; }
rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
stat_of() { "$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK" | awk -v k="$1" '$1==k{print $2}'; }
latency() {  # p50 p99 lost of a subscriber at RATE for 5 s
  RDMABROKER_PASSWORD=$PASSWORD "$BIN/client-lib/rdmabroker" bench -s "$URL" -b "$LEGIT" -u alice --json --quiet \
    --rate "$RATE" -d 5 --size 64 2>/dev/null |
    python3 -c 'import json,sys; a=json.load(sys.stdin)["aggregate"]; l=a["latency"]; print("%.0f %.0f %d" % (l["p50_us"], l["p99_us"], a["lost"]))' ||
    echo "- - failed"
}
field() { python3 -c "import json,sys; print(json.load(open('$1'))['$2'])"; }

{
printf '%s\n' "$VIA, $GUESSERS guessers + $HOLDERS never-authenticating connections from $FLOOD, logins from $LEGIT"
for b in "${BINS[@]}"; do
  EXTRA=()
  [ "$b" != "$BIN" ] || read -r -a EXTRA <<<"${FIRST_ARGS:-}"
  "$b/daemon/rdmabrokerd" --config "$OUT/broker.yaml" "${TRANSPORT[@]}" --listen 0.0.0.0 --admin-socket "$SOCK" \
    --metrics-listen "" --workers 2 "${EXTRA[@]}" &
  BROKER=$!
  trap 'kill $BROKER 2>/dev/null || true' EXIT
  for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
  sleep 1
  RSS0=$(rss_kib "$BROKER")
  "$FLOOD_BIN" "$URL" alice "$PASSWORD" "$LEGIT" "$FLOOD" 0 0 "$LOGINS" >"$OUT/quiet.json" || true
  read -r QP50 QP99 QLOST <<<"$(latency)"
  FAILED0=$(stat_of auth.failed) CHECKED0=$(stat_of auth.check_failures)
  T0=$SECONDS
  "$FLOOD_BIN" "$URL" alice "$PASSWORD" "$LEGIT" "$FLOOD" "$GUESSERS" "$HOLDERS" "$LOGINS" 20 >"$OUT/flood.json" &
  FLOOD_PID=$!
  sleep 4  # the flood's own 3 s to reach its steady state
  # Where the CPU goes while the subscriber measures: the broker, the flood
  # (its threads share these cores: on one host it is the attacker's CPU too).
  B0=$(cpu_ticks "$BROKER") F0=$(cpu_ticks "$FLOOD_PID") C0=$SECONDS K0=$(kernel_busy)  # the flood lasts 20 s: past this
  read -r FP50 FP99 FLOST <<<"$(latency)"
  B1=$(cpu_ticks "$BROKER") F1=$(cpu_ticks "$FLOOD_PID") C1=$SECONDS K1=$(kernel_busy)
  kill -0 "$FLOOD_PID" 2>/dev/null || F1=  # the flood ended first: its share is unknown
  RSS1=$(rss_kib "$BROKER")
  wait "$FLOOD_PID" || true
  FAILED1=$(stat_of auth.failed) CHECKED1=$(stat_of auth.check_failures)
  FLOOD_S=$((SECONDS - T0))
  sleep 10
  RSS2=$(rss_kib "$BROKER")
  kill "$BROKER"
  wait "$BROKER" 2>/dev/null || true
  rm -f "$SOCK"
  printf '\n%s\n\n' "The broker of \`$b\`${EXTRA[*]:+ with \`${EXTRA[*]}\`}:"
  printf -- '- logins, quiet: p50 %s ms, p99 %s ms, max %s ms, %s failed of %s\n' "$(field "$OUT/quiet.json" login_p50_ms)" \
    "$(field "$OUT/quiet.json" login_p99_ms)" "$(field "$OUT/quiet.json" login_max_ms)" \
    "$(field "$OUT/quiet.json" login_failures)" "$LOGINS"
  printf -- '- logins, flood: p50 %s ms, p99 %s ms, max %s ms, %s failed of %s %s\n' "$(field "$OUT/flood.json" login_p50_ms)" \
    "$(field "$OUT/flood.json" login_p99_ms)" "$(field "$OUT/flood.json" login_max_ms)" \
    "$(field "$OUT/flood.json" login_failures)" "$LOGINS" "$(field "$OUT/flood.json" first_error)"
  # auth.failed: failed logins (wrong secrets checked, and login deadlines); auth.check_failures
  # (builds that have it): wrong secrets that crypt(3) checked, i.e. guesses really tried.
  printf -- '- guesses: %s attempted; failed logins %s in %s s (%s/s), of which crypt(3) checked %s (%s/s); never-authenticating connections opened %s, refused %s\n' \
    "$(field "$OUT/flood.json" guess_attempts)" "$((FAILED1 - FAILED0))" "$FLOOD_S" \
    "$(awk -v n=$((FAILED1 - FAILED0)) -v s="$FLOOD_S" 'BEGIN{printf "%.1f", n / s}')" \
    "${CHECKED1:+$((CHECKED1 - CHECKED0))}" \
    "$([ -n "$CHECKED1" ] && awk -v n=$((CHECKED1 - CHECKED0)) -v s="$FLOOD_S" 'BEGIN{printf "%.1f", n / s}' || echo "-")" \
    "$(field "$OUT/flood.json" held)" "$(field "$OUT/flood.json" hold_refused)"
  printf -- '- subscriber at %s msg/s: quiet p50 %s µs p99 %s µs lost %s; flood p50 %s µs p99 %s µs lost %s\n' \
    "$RATE" "$QP50" "$QP99" "$QLOST" "$FP50" "$FP99" "$FLOST"
  read -r KB0 KK0 <<<"$K0"
  read -r KB1 KK1 <<<"$K1"
  awk -v b=$((B1 - B0)) -v f=$((${F1:-0} - F0)) -v s=$((C1 - C0)) -v busy=$((KB1 - KB0)) -v kern=$((KK1 - KK0)) \
    -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" -v gone="$([ -n "$F1" ] && echo 0 || echo 1)" 'BEGIN {
    printf "- CPU while the subscriber measured the flood (%d s): all %.2f of %d cores busy, the kernel %.2f of them; broker %.2f, flood %s\n",
      s, busy / hz / s, n, kern / hz / s, b / hz / s, gone ? "(ended before the window)" : sprintf("%.2f", f / hz / s) }'
  printf -- '- broker RSS: %s MiB before, %s MiB in the flood, %s MiB 10 s after\n' \
    "$(awk -v k="$RSS0" 'BEGIN{printf "%.1f", k/1024}')" "$(awk -v k="$RSS1" 'BEGIN{printf "%.1f", k/1024}')" \
    "$(awk -v k="$RSS2" 'BEGIN{printf "%.1f", k/1024}')"
done
} | doc_table "login-flood-$VIA"
rm -rf "$OUT"
