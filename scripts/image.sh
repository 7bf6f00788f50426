#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the container image of rdmabrokerd (OCI image layout) from Debian 12
# packages and the project's .debs, with no container engine and no registry:
# mmdebstrap makes the root file system, umoci the image. Then checks it the
# way a cluster runs it: as its non-root user, on a read-only root with
# tmpfs on /run and /tmp, the daemon and CLI answer --version, the shipped
# configuration is valid, and a subscriber gets a message published over
# TCP through a broker started from the image's root.
#   scripts/image.sh [BUILD_DIR]    (default build/release; runs
#                                    scripts/package.sh first if no .debs)
# Out: BUILD_DIR/image/oci, an OCI layout tagged with the version (push it:
# skopeo copy oci:BUILD_DIR/image/oci:VERSION docker://REGISTRY/rdmabroker:VERSION),
# and BUILD_DIR/image/rootfs. As root (mmdebstrap's root mode, chroot).
# RDMABROKER_IMAGE_SOURCES: the apt sources of the image (default: this
# host's /etc/apt/sources.list.d/debian.sources, else deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/release}
[ "$(id -u)" = 0 ] || { echo "image.sh: must run as root (mmdebstrap, chroot)" >&2; exit 1; }
V=$(sed -n 's/^project(rdmabroker VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
A=$(dpkg --print-architecture)
debs=("$DIR/rdmabroker_${V}_$A.deb" "$DIR/rdmabroker-clients_${V}_$A.deb" "$DIR/librdmabroker0_${V}_$A.deb")
[ -f "${debs[0]}" ] || scripts/package.sh "$DIR" >/dev/null
OUT=$DIR/image
ROOT=$OUT/rootfs
rm -rf "$OUT"
mkdir -p "$OUT"
sources=${RDMABROKER_IMAGE_SOURCES:-/etc/apt/sources.list.d/debian.sources}
[ -f "$sources" ] || sources=http://deb.debian.org/debian

# 1. The root file system: Debian's minimal system with apt, the daemon, the
# CLI (kubectl exec ... rdmabroker stat/reload) and the library, their
# dependencies from Debian; no manual pages, translations or documentation
# but the copyright files.
start=$(date +%s)
mmdebstrap --variant=apt --quiet \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='mkdir -p "$1/tmp/debs"' \
  --customize-hook="copy-in ${debs[*]} /tmp/debs" \
  --customize-hook='chroot "$1" sh -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /tmp/debs/*.deb >/dev/null"' \
  --customize-hook='chroot "$1" sh -c "apt-get clean && rm -rf /tmp/debs /var/lib/apt/lists/* /var/log/*.log /var/cache/ldconfig/aux-cache"' \
  bookworm "$ROOT" "$sources" >"$OUT/mmdebstrap.log" 2>&1 ||
  { tail -30 "$OUT/mmdebstrap.log" >&2; echo "image.sh: mmdebstrap failed" >&2; exit 1; }
uid=$(awk -F: '$1 == "rdmabroker" {print $3 ":" $4}' "$ROOT/etc/passwd")
[ -n "$uid" ] || { echo "image.sh: the packages made no rdmabroker user" >&2; exit 1; }
echo "image.sh: root file system in $(($(date +%s) - start)) s, $(du -sm "$ROOT" | cut -f1) MiB, user rdmabroker is $uid"

# 2. The image: one layer, run as the rdmabroker user (numeric, so that a
# cluster can check runAsNonRoot), the daemon as entry point reading the
# packaged configuration; /run/rdmabroker (the admin socket) is a volume, so
# the root can be read-only.
umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:$V"
tar --numeric-owner --xattrs -C "$ROOT" -cf "$OUT/layer.tar" .
umoci raw add-layer --image "$OUT/oci:$V" "$OUT/layer.tar"
rm -f "$OUT/layer.tar"
umoci config --image "$OUT/oci:$V" --config.user "$uid" \
  --config.entrypoint /usr/sbin/rdmabrokerd --config.cmd --config --config.cmd /etc/rdmabroker/broker.yaml \
  --config.exposedports 7470/tcp --config.exposedports 7471/tcp --config.exposedports 9464/tcp \
  --config.volume /run/rdmabroker \
  --config.label org.opencontainers.image.title=rdmabroker \
  --config.label org.opencontainers.image.version="$V" \
  --config.label org.opencontainers.image.licenses=Apache-2.0 \
  --history.created_by "scripts/image.sh (mmdebstrap bookworm + the project's .debs)"
umoci gc --layout "$OUT/oci"
echo "image.sh: $OUT/oci:$V ($(du -sm "$OUT/oci" | cut -f1) MiB)"

# 3. The smoke test. in_image CMD...: CMD as the image's user, on its root
# bound read-only, with tmpfs on /run and /tmp, in a mount namespace of its
# own (the host's network, as hostNetwork: true).
IN_IMAGE='root=$1 user=$2; shift 2
  mount --bind "$root" "$root" && mount -o remount,bind,ro "$root" &&
  mount -t tmpfs tmpfs "$root/run" && mount -t tmpfs tmpfs "$root/tmp" &&
  exec chroot --userspec="$user" "$root" "$@"'
in_image() { unshare -m -- sh -c "$IN_IMAGE" sh "$ROOT" "$uid" "$@"; }
fail=0
check() {  # check NAME CMD...
  local name=$1
  shift
  if "$@"; then echo "image.sh: ok   $name"; else echo "image.sh: FAIL $name" >&2; fail=1; fi
}
check "rdmabrokerd --version" bash -c '[ "$1" = "rdmabrokerd $2" ]' _ "$(in_image /usr/sbin/rdmabrokerd --version)" "$V"
check "rdmabroker --version" bash -c '[ "$1" = "rdmabroker $2" ]' _ "$(in_image /usr/bin/rdmabroker --version)" "$V"
valid_config() { in_image /usr/sbin/rdmabrokerd --check-config /etc/rdmabroker/broker.yaml >"$OUT/check-config.out" 2>&1; }
check "the packaged configuration is valid" valid_config
# /var/tmp is writable by anyone, but not on a read-only root; /tmp is a tmpfs.
read_only_root() { ! in_image /bin/sh -c ': >/var/tmp/w' 2>/dev/null && in_image /bin/sh -c ': >/tmp/w'; }
check "the root is read-only, /tmp writable" read_only_root
port=$((20000 + RANDOM % 20000))
# exec: $! is the broker itself, for the SIGTERM below.
(exec unshare -m -- sh -c "$IN_IMAGE" sh "$ROOT" "$uid" /usr/sbin/rdmabrokerd --no-config --allow-anonymous \
  --tcp-port "$port" --metrics-listen "" --admin-socket /run/rdmabroker/admin.sock --log-level warn) &
broker=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
in_image /usr/bin/rdmabroker sub image.smoke -n 1 --timeout 20 -s "tcp://127.0.0.1:$port" >"$OUT/sub.out" 2>&1 &
sub=$!
sleep 1
check "a TCP publish inside the image" in_image /usr/bin/rdmabroker pub image.smoke "hello from the image" -s "tcp://127.0.0.1:$port"
wait "$sub" || true
check "... reaches a subscriber inside the image" grep -q "image.smoke: hello from the image" "$OUT/sub.out"
kill "$broker" 2>/dev/null || true
check "the broker stops cleanly on SIGTERM" wait "$broker"
exit $fail
