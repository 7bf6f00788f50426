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
# host_build TARGET...: builds these targets of $BIN, outside the guest
# only: there ninja would compile under emulation whatever source changed
# since the host built it (a suite run took 20 minutes more that way).
host_build() {
  [ "${RDMABROKER_GUEST:-}" = 1 ] || ninja -C "$BIN" "$@" >/dev/null 2>&1 || true
}
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

# run_perftest LIMIT OUT TOOL ARGS...: one perftest measurement, rxe1 -> rxe0
# in rdma_cm mode (-R; A1 is on rxe0): its server on rxe0, its client's report
# in OUT. The reference tool itself fails now and then under emulation, and
# none of these is a measurement of ours: its client has segfaulted
# (ib_send_lat -e, once in a CI run), hung (ib_send_bw 16 MiB, once), and,
# about once in 40 runs on a loaded host, ended with no result because its
# own clock calibration failed ("Correlation coefficient r^2: 0.899 < 0.9,
# Can't produce a report"; ib_send_bw 1 MiB, CI 2026-12-02, reproduced 1/40
# in the guest). So a run whose client leaves no result line is run again
# once, and said so; the second answer stands. A client still running after
# LIMIT s is stopped, and so is its server, which would otherwise wait for
# ever. Returns 0 when OUT holds a result line.
run_perftest() {
  local limit=$1 out=$2 tool=$3 attempt rc port server
  shift 3
  for attempt in 1 2; do
    port=$((18500 + RANDOM % 400))
    timeout "$limit" "$tool" -R -d rxe0 -p "$port" "$@" >/tmp/perftest-server.txt 2>&1 &
    server=$!
    sleep 1
    rc=0
    timeout "$limit" "$tool" -R -d rxe1 -p "$port" "$@" "$A1" >"$out" 2>&1 || rc=$?
    [ "$rc" = 0 ] || kill "$server" 2>/dev/null || true
    wait "$server" || true
    perftest_result_in "$out" && return 0
    [ "$attempt" = 1 ] || break
    case $rc in
      0) echo "perftest: $tool $*: no result line ($(perftest_why "$out")); running it again" >&2 ;;
      124) echo "perftest: $tool $*: still running after $limit s; running it again" >&2 ;;
      *) echo "perftest: $tool $*: exit status $rc ($(perftest_why "$out")); running it again" >&2 ;;
    esac
  done
  return 1
}
# perftest_result_in FILE: whether a perftest client's report has its result
# line (#bytes #iterations ... with numbers).
perftest_result_in() { awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 { found = 1 } END { exit !found }' "$1"; }
# perftest_why FILE: the line of a failed perftest client's report that says why.
perftest_why() {
  grep -m1 -i "r^2\|error\|fail\|can.t\|couldn.t\|unable" "$1" || echo "no error line"
}

# raw_lat [-e]: ib_send_lat, 64 B, rxe1 -> rxe0; its typical (median)
# one-way µs.
raw_lat() {
  run_perftest 300 /tmp/raw-lat.txt ib_send_lat ${1:+"$1"} -s 64 -n 2000 || true
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
