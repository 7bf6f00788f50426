#!/usr/bin/env bash
# Builds the Debian package from a build tree and checks what it holds:
#   scripts/package.sh [BUILD_DIR]   (default build/release)
# Prints the .deb's path on the last line. test.sh runs it, so a package that
# lost its unit, its conffile or its maintainer scripts fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/release}
[ -f "$DIR/CMakeCache.txt" ] || scripts/build.sh "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
ninja -C "$DIR" >/dev/null
(cd "$DIR" && cpack -G DEB >/dev/null)
DEB=$(ls -t "$DIR"/rdmabroker_*.deb | head -1)
contents=$(dpkg-deb -c "$DEB" | awk '{print $6}')
fail=0
for f in ./usr/sbin/rdmabrokerd ./usr/bin/rdmabroker ./usr/lib/librdmabroker.so.0 ./etc/rdmabroker/broker.yaml \
         ./usr/lib/systemd/system/rdmabrokerd.service ./usr/lib/sysusers.d/rdmabroker.conf \
         ./usr/lib/tmpfiles.d/rdmabroker.conf ./usr/share/doc/rdmabroker/operations.md; do
  grep -qx -- "$f" <<<"$contents" || { echo "package.sh: $DEB lacks $f" >&2; fail=1; }
done
info=$(dpkg-deb -I "$DEB")
for want in "conffiles" "postinst" "prerm" "postrm" "Depends: .*rdma-core" "Depends: .*libibverbs1"; do
  grep -q "$want" <<<"$info" || { echo "package.sh: $DEB control lacks '$want'" >&2; fail=1; }
done
[ "$(dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles)" = /etc/rdmabroker/broker.yaml ] ||
  { echo "package.sh: broker.yaml is not a conffile" >&2; fail=1; }
[ $fail = 0 ] || exit 1
echo "$DEB"
