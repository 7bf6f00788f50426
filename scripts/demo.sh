#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The broker's main job, end to end: builds rdmabrokerd and the rdmabroker CLI,
# starts the broker, a subscriber and a publisher, and shows the messages
# crossing over RDMA. On a host with an RDMA device it runs right here; on a
# host without one it runs inside the Soft-RoCE guest (tests/softroce/).
#   sudo scripts/demo.sh            # set-up + demo
#   scripts/demo.sh --inner         # the demo itself (needs an RDMA device)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != "--inner" ]; then
  scripts/install-deps.sh
  scripts/build.sh build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo
  if ibv_devices 2>/dev/null | grep -qv -e '^ *device' -e '^ *------'; then
    echo "demo: this host has an RDMA device: running here"
    exec scripts/demo.sh --inner
  fi
  echo "demo: no RDMA device on this host: running in the Soft-RoCE guest (rdma_rxe on Debian's kernel, under QEMU)"
  exec tests/softroce/run-in-guest.sh scripts/demo.sh --inner
fi

BIN=build/release
ADDR=${RDMABROKER_GUEST_ADDR1:-$(ip -4 -o addr show scope global | awk '{split($4,a,"/"); print a[1]; exit}')}
CLIENT_BIND=${RDMABROKER_GUEST_ADDR2:-}
PORT=7470
URL="rdma://$ADDR:$PORT"
SOCK=$(mktemp -u /tmp/rdmabroker-demo.XXXXXX.sock)
echo "demo: RDMA devices: $(ibv_devices | awk 'NR>2{printf "%s ", $1}')"

"$BIN/daemon/rdmabrokerd" --listen 0.0.0.0 --port "$PORT" --admin-socket "$SOCK" --workers 2 --allow-anonymous &
BROKER=$!
trap 'kill $BROKER 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done

bind=(); [ -n "$CLIENT_BIND" ] && bind=(--bind "$CLIENT_BIND")
echo "demo: subscriber on 'demo.greetings' (waits for 5 messages)"
"$BIN/client-lib/rdmabroker" sub demo.greetings --count 5 --timeout 60 -v -s "$URL" "${bind[@]}" &
SUB=$!
for _ in $(seq 100); do
  "$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK" | grep -q '^subscriptions 1$' && break
  sleep 0.1
done
echo "demo: publisher sends 5 messages"
for i in 1 2 3 4 5; do echo "hello #$i over RDMA"; done | "$BIN/client-lib/rdmabroker" pub demo.greetings - -v -s "$URL"
wait $SUB
echo "demo: broker counters:"
"$BIN/client-lib/rdmabroker" stat --admin-socket "$SOCK" | grep -E '^(connections\.(accepted|current)|messages\.(in|delivered)|rdma\.(sends_posted|frames_sent)) '
kill -TERM $BROKER
wait $BROKER
trap - EXIT
echo "demo: broker stopped cleanly"
