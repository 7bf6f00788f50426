#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The real systemd unit, driven by systemctl, in a guest where systemd is PID 1
# and Soft-RoCE provides RDMA (run-in-guest.sh with RDMABROKER_GUEST_INIT=systemd):
#   1. installs the packages (the daemon's postinst: user, directories, enable
#      and start the unit the Debian way) and waits for READY=1 (Type=notify);
#   2. authentication as shipped: anonymous clients are refused; a user added
#      with `rdmabroker passwd` and `systemctl reload` gets in; then checks
#      the broker serves RDMA under the hardened unit (DeviceAllow,
#      LimitMEMLOCK) with real clients, and its status line;
#   3. reload with a changed log level: succeeds, the journal says so;
#   4. reload with an invalid file: `systemctl reload` fails, the broker keeps
#      running (same PID, no restart), the journal names line, column and key;
#   5. stays up past WatchdogSec (the watchdog is being fed);
#   6. stop: clean exit, inactive (not failed);
#   7. removal and purge: the daemon package leaves its configuration on
#      `dpkg -r` and nothing on `dpkg -P`; without librdmabroker0 the dynamic
#      linker no longer knows the library (its ldconfig trigger ran).
# Prints "systemd: N passed, M failed"; exit status 0 only if all passed.
#   tests/softroce/run-in-guest.sh tests/softroce/systemd-suite.sh DEB...
# DEB... are the packages of scripts/package.sh (its last line).
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: systemd-suite.sh PACKAGE.deb..." >&2; exit 2; }
[ "${RDMABROKER_GUEST_INIT:-}" = systemd ] || { echo "systemd-suite: run it in the guest with RDMABROKER_GUEST_INIT=systemd" >&2; exit 2; }
A1=${RDMABROKER_GUEST_ADDR1:?}
A2=${RDMABROKER_GUEST_ADDR2:?}
pass=0
fail=0
check() {  # check NAME COMMAND...: one assertion
  local name=$1
  shift
  if "$@"; then
    echo "ok   $name ($SECONDS s)"
    pass=$((pass + 1))
  else
    echo "FAIL $name"
    fail=$((fail + 1))
  fi
}
prop() { systemctl show -p "$1" --value rdmabrokerd.service; }
journal_has() { journalctl -u rdmabrokerd.service --no-pager -o cat | grep -qF -- "$1"; }
CLI=/usr/bin/rdmabroker
CONF=/etc/rdmabroker/broker.yaml

# 1. install and start. A container image's policy-rc.d (exit 101: "do not
# start services") would stop deb-systemd-invoke; this guest is a normal
# system, and the file is gone with the guest's overlay.
rm -f /usr/sbin/policy-rc.d
# The package's manual pages trigger man-db, which re-indexes every manual
# page of the (host's) root: 100 s of the emulated guest's time, for nothing
# tested here (Debian's trigger does nothing without this file).
rm -f /var/lib/man-db/auto-update
export DEBIAN_FRONTEND=noninteractive
check "dpkg -i installs the packages" bash -c 'dpkg -i "$@" >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; false; }' _ "$@"
for p in rdmabroker rdmabroker-clients librdmabroker0 librdmabroker-dev python3-rdmabroker; do
  check "$p is installed" test "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed"
done
check "the linker cache knows librdmabroker.so.0" bash -c "ldconfig -p | grep -q 'librdmabroker.so.0 '"
check "the rdmabroker user exists" bash -c "id rdmabroker >/dev/null"
check "the config is a root:rdmabroker 0640 conffile" test "$(stat -c '%U:%G %a' "$CONF")" = "root:rdmabroker 640"
for _ in $(seq 60); do [ "$(prop ActiveState)" = active ] && break; sleep 0.5; done
check "the unit is enabled" test "$(systemctl is-enabled rdmabrokerd.service)" = enabled
check "the unit is active after READY=1" test "$(prop ActiveState)" = active
check "it runs as rdmabroker" test "$(ps -o uid= -p "$(prop MainPID)" | tr -d ' ')" = "$(id -u rdmabroker)"
check "its status says where it listens" bash -c "systemctl show -p StatusText --value rdmabrokerd | grep -q 'listening on rdma://0.0.0.0:7470'"
# Reload needs nothing outside the daemon's package (rdmabroker-clients is
# only Recommended): ExecReload runs the daemon itself.
check "ExecReload runs /usr/sbin/rdmabrokerd --reload" bash -c 'grep -qF -- "$1" <<<"$2"' _ \
  "argv[]=/usr/sbin/rdmabrokerd --reload --admin-socket /run/rdmabroker/admin.sock" "$(prop ExecReload)"
PID=$(prop MainPID)

# 2. authentication as shipped (auth.anonymous: false, no users): an
# anonymous client is refused and told why; a user added to the file with a
# hash from `rdmabroker passwd` is accepted after a reload.
OUT=$("$CLI" pub guest.x hi -s "rdma://$A1:7470" -b "$A2" 2>&1)
check "an anonymous client is refused (exit 77, EX_NOPERM)" test $? = 77
check "... and told why" grep -q "authentication failed" <<<"$OUT"
check "the journal has the refusal" journal_has "authentication failed"
HASH=$(printf 'guest-pw\n' | "$CLI" passwd --scheme sha512crypt --cost 1000)
check "rdmabroker passwd prints a hash" grep -q '^\$6\$' <<<"$HASH"
H="$HASH" perl -pi -e 's/^  users: \[\].*$/  users:\n    - {name: guest, password: "$ENV{H}", subscribe: {allow: ["svc.>", "_INBOX.>"]}}/' "$CONF"
check "the config passes --check-config" /usr/sbin/rdmabrokerd --check-config "$CONF"
check "systemctl reload adds the user" systemctl reload rdmabrokerd.service
check "the journal shows the new user" journal_has "-> [guest (password"
export RDMABROKER_USER=guest RDMABROKER_PASSWORD=guest-pw
OUT=$("$CLI" sub other.x -n 1 --timeout 2 -s "rdma://$A1:7470" -b "$A2" 2>&1)
check "a subscription outside the user's permissions is refused" grep -q "subscribe to 'other.x' denied for user 'guest'" <<<"$OUT"

# Serves RDMA under the hardened unit: a request nobody serves gets its
# answer from the broker (exit 4), a responder's request gets the reply.
"$CLI" reply svc.guest "from the unit" -n 1 -s "rdma://$A1:7470" -b "$A2" >/dev/null 2>&1 &
R=$!
for _ in $(seq 50); do "$CLI" stat | grep -q '^subscriptions 1$' && break; sleep 0.2; done
check "a client gets a reply over RDMA" test "$("$CLI" request svc.guest hi -s "rdma://$A1:7470" -b "$A2")" = "from the unit"
"$CLI" request svc.nobody hi -s "rdma://$A1:7470" -b "$A2" >/dev/null 2>&1
check "no responders over RDMA (exit 4)" test $? = 4
wait $R
# The Python package as installed (python3-rdmabroker over librdmabroker0):
# a subscriber and a publisher over RDMA through the unit's broker.
PY=$(cd / && /usr/bin/python3 - "$A1" "$A2" 2>&1 <<'PYEOF'
import sys, rdmabroker
assert rdmabroker.__file__.startswith("/usr/lib/python3/dist-packages/"), rdmabroker.__file__
url = "rdma://guest:guest-pw@%s:7470" % sys.argv[1]
with rdmabroker.connect(url, sys.argv[2]) as sub, rdmabroker.connect(url, sys.argv[2]) as pub:
    s = sub.subscribe("svc.python")
    sub.flush()
    pub.publish("svc.python", b"from python3-rdmabroker")
    print(s.next(timeout=10).data.decode())
PYEOF
)
check "python3-rdmabroker publishes and subscribes over RDMA" test "$PY" = "from python3-rdmabroker"
[ "$PY" = "from python3-rdmabroker" ] || echo "$PY"
unset RDMABROKER_USER RDMABROKER_PASSWORD
check "the broker counted RDMA receives" bash -c "$CLI stat | awk '\$1==\"rdma.receives\"{found=1; exit !(\$2>0)} END{if(!found) exit 1}'"
check "metrics are served" bash -c "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && grep -q '^rdmabroker_connections_accepted_total' <&3"

# 3. reload with a changed log level
sed -i 's/^  level: info /  level: debug/' "$CONF"
check "the example config now says debug" grep -q '^  level: debug' "$CONF"
check "systemctl reload succeeds" systemctl reload rdmabrokerd.service
check "the journal shows the new level" journal_has "logging.level info -> debug"
check "still the same process" test "$(prop MainPID)" = "$PID"

# 4. reload with an invalid file: fails, the broker keeps running
cp "$CONF" /tmp/broker.yaml.good
printf 'limits:\n  max_subscriptions: lots\n' >>"$CONF"
systemctl reload rdmabrokerd.service 2>/dev/null
check "systemctl reload fails on an invalid file" test $? != 0
check "the broker is still active" test "$(prop ActiveState)" = active
check "same process, no restart" test "$(prop MainPID)" = "$PID" -a "$(prop NRestarts)" = 0
check "the journal names the key" journal_has "limits.max_subscriptions: expected an integer"
cp /tmp/broker.yaml.good "$CONF"

# 5. the watchdog is fed: still up past WatchdogSec
check "WatchdogSec is set" test "$(prop WatchdogUSec)" = 10s
sleep 12
check "alive after WatchdogSec" test "$(prop ActiveState)" = active -a "$(prop MainPID)" = "$PID"

# 6. stop
check "systemctl stop succeeds" systemctl stop rdmabrokerd.service
check "inactive, not failed" test "$(prop ActiveState)" = inactive
check "exited with status 0" test "$(prop ExecMainStatus)" = 0
check "the journal has the orderly stop" journal_has "stopped:"
EXPOSURE=$(systemd-analyze security rdmabrokerd.service 2>/dev/null | grep -o 'rdmabrokerd.service: [0-9.]*' | awk '{print $2}')
echo "     systemd-analyze security: exposure $EXPOSURE"
check "hardening exposure is at most 2.0" awk -v e="$EXPOSURE" 'BEGIN{exit !(e != "" && e + 0 <= 2.0)}'

# 7. removal and purge
check "dpkg -r removes the daemon" bash -c "dpkg -r rdmabroker >/dev/null"
check "... its binary is gone" test ! -e /usr/sbin/rdmabrokerd
check "... its edited configuration stays" grep -q '^  level: debug' "$CONF"
check "dpkg -P purges the configuration" bash -c "dpkg -P rdmabroker >/dev/null && test ! -e /etc/rdmabroker"
check "the other packages are removed" bash -c "dpkg -r python3-rdmabroker librdmabroker-dev rdmabroker-clients librdmabroker0 >/dev/null"
check "... the Python package without a trace (py3clean)" test ! -e /usr/lib/python3/dist-packages/rdmabroker
check "... and the linker cache forgot librdmabroker.so.0" bash -c "! ldconfig -p | grep -q librdmabroker"

echo "systemd: $pass passed, $fail failed"
[ "$fail" = 0 ]
