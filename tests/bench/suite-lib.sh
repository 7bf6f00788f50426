# SPDX-License-Identifier: Apache-2.0
# Shared by tests/bench/suite.sh and suite-guest.sh (sourced): each function
# runs or parses one measurement and writes it as one JSON file into $OUT,
# through tests/bench/suite_report.py, which later turns them all into the
# CSV, the markdown table and the plots.
REPORT="python3 tests/bench/suite_report.py"
SEQ_NO=0

# For a script that needs RDMA: returns where there is an RDMA device (or
# inside the guest); elsewhere builds what the benchmarks run from $BIN and
# re-runs the command line it is given inside the Soft-RoCE guest, with
# RDMABROKER_BIN passed along. Usage: in_guest_unless_rdma "$0" "$@"
in_guest_unless_rdma() {
  if [ "${RDMABROKER_GUEST:-}" = 1 ] || ibv_devices 2>/dev/null | grep -q -e rxe -e mlx; then return 0; fi
  [ -f "$BIN/CMakeCache.txt" ] || scripts/build.sh "$BIN" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  ninja -C "$BIN" rdmabrokerd rdmabroker_cli hold_connections >/dev/null
  exec tests/softroce/run-in-guest.sh env RDMABROKER_BIN="$BIN" "$@"
}

# Prefixes each line with the seconds since the script started (where the
# suite's time goes).
elapsed() {
  local line
  while IFS= read -r line; do printf '[%4d s] %s\n' "$SECONDS" "$line"; done
}

# start_broker ARGS...: rdmabrokerd from $BIN with the benchmarks' common
# flags (TCP off, no metrics, two workers, anonymous clients, warnings only)
# and ARGS (later flags win); its admin socket is $SOCK. Waits for the socket;
# BROKER is its pid. stop_broker ends it (also on exit).
start_broker() {
  "$BIN/daemon/rdmabrokerd" --tcp-port 0 --admin-socket "$SOCK" --metrics-listen "" --workers 2 \
    --allow-anonymous --log-level warn "$@" &
  BROKER=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
  trap stop_broker EXIT
}
# broker_on_both_transports RDMA_PORT TCP_PORT: a broker serving RDMA and TCP
# (in the guest), or TCP only when HOST=1 (this host has no RDMA); URLS lists
# its URLs on A1, RDMA first.
broker_on_both_transports() {
  if [ "${HOST:-0}" = 1 ]; then
    start_broker --rdma off --tcp-port "$2"
    URLS=("tcp://$A1:$2")
  else
    start_broker --port "$1" --tcp-port "$2"
    URLS=("rdma://$A1:$1" "tcp://$A1:$2")
  fi
}
stop_broker() {
  kill "$BROKER" 2>/dev/null && wait "$BROKER" 2>/dev/null || true
  rm -f "$SOCK"
}

cpu_ticks() {  # utime + stime of PID, in clock ticks
  awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# defer_record FILE INPUT ARGS...: FILE's record is written later from INPUT
# (a file, copied) by `suite_report.py ARGS...`, together with every other
# deferred record in one Python process (record_deferred): Python takes about
# 7 s to start in the emulated guest, which was most of a quick run's time.
defer_record() {
  local file=$1 input=$2
  shift 2
  cp "$input" "$file.in"
  printf '%s\n' "$@" >"$file.args"
}
# record_deferred DIR: writes the deferred records in DIR, prints their summaries.
record_deferred() {
  $REPORT record-deferred "$1"
}

# run_bench SYSTEM TRANSPORT GROUP SIZE SERVER_PID COMMAND...: runs a bench
# command (`rdmabroker bench` or a driver) with --json and records it with the
# server's CPU time over the run (deferred).
run_bench() {
  local system=$1 transport=$2 group=$3 size=$4 server=$5
  shift 5
  SEQ_NO=$((SEQ_NO + 1))
  local file="$OUT/$(printf %03d $SEQ_NO)-$system-$transport-$group-$size.json"
  local c0 c1 rc=0
  c0=$(cpu_ticks "$server")
  "$@" --json --quiet >/tmp/bench-run.json 2>/tmp/bench-run.err || rc=$?
  c1=$(cpu_ticks "$server")
  cp /tmp/bench-run.err "$file.err"
  defer_record "$file" /tmp/bench-run.json record-bench --system "$system" --transport "$transport" --group "$group" \
    --size "$size" --server-cpu-s "$(awk -v a="$c0" -v b="$c1" -v t="$(getconf CLK_TCK)" 'BEGIN { print (b - a) / t }')" \
    --exit-status "$rc" --stderr "$file.err"
  echo "$system $transport $group $size B: exit status $rc" | elapsed
}

# record_perftest TOOL SIZE OUTPUT_FILE: the client side's report of
# ib_send_bw or ib_send_lat (deferred).
record_perftest() {
  SEQ_NO=$((SEQ_NO + 1))
  local file="$OUT/$(printf %03d $SEQ_NO)-raw-$1-$2.json"
  defer_record "$file" "$3" record-perftest --tool "$1" --size "$2"
  echo "raw $1 $2 B: done" | elapsed
}

# record_idle_rss TRANSPORT "idle-rss: ..." (the line tests/bench/idle-rss.sh prints)
record_idle_rss() {
  SEQ_NO=$((SEQ_NO + 1))
  local file="$OUT/$(printf %03d $SEQ_NO)-idle-rss-$1.json"
  echo "$2" >/tmp/idle-rss.txt
  defer_record "$file" /tmp/idle-rss.txt record-idle --transport "$1"
  echo "$2" | elapsed
}

# raw_lat [-e]: ib_send_lat, 64 B, rxe1 -> rxe0 (A1 is on rxe0); its typical
# (median) one-way µs.
raw_lat() {
  local port=$((18500 + RANDOM % 400))
  timeout 300 ib_send_lat -R ${1:+"$1"} -d rxe0 -s 64 -n 2000 -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  timeout 300 ib_send_lat -R ${1:+"$1"} -d rxe1 -s 64 -n 2000 -p "$port" "$A1" >/tmp/raw-lat.txt 2>&1 ||
    kill "$server" 2>/dev/null || true
  wait "$server" || true
  awk '$1 == 64 { print $5 }' /tmp/raw-lat.txt
}

# ... | doc_table NAME: prints what comes in (on stdout: the suite reads
# idle-rss.sh's line from it) and writes it into docs/benchmarks.md's
# section NAME, with the date and commit (tests/bench/docs_section.py); a
# run whose arguments have no section there (another rate, another count)
# only prints.
doc_table() {
  mkdir -p build
  tee "build/bench-$1.out"
  # A broker's log lines on the way (its warnings) stay out of the page.
  grep -v '^[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]T[0-9:.]* ' "build/bench-$1.out" >"build/bench-$1.md" || true
  rm -f "build/bench-$1.out"
  if grep -q "<!-- $1:begin" docs/benchmarks.md; then
    python3 tests/bench/docs_section.py "$1" "build/bench-$1.md"
  else
    echo "(no section '$1' in docs/benchmarks.md: not written there)" >&2
  fi
}
