#!/usr/bin/env bash
# Builds the Debian package from a build tree and checks what it holds:
#   scripts/package.sh [BUILD_DIR]   (default build/release)
# Prints the .deb's path on the last line. test.sh runs it, so a package that
# lost its unit, its conffile or its maintainer scripts fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build/release}
[ -f "$DIR/CMakeCache.txt" ] || scripts/build.sh "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fail=0
# `cmake --install --prefix DIR` with the default install paths puts every
# file inside DIR, the configuration too (DIR/etc/rdmabroker/broker.yaml).
cmake -S . -B "$DIR" -DCMAKE_INSTALL_PREFIX=/usr/local -DCMAKE_INSTALL_SYSCONFDIR=etc -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
ninja -C "$DIR" >/dev/null
prefix=$(mktemp -d)
cmake --install "$DIR" --prefix "$prefix" >/dev/null
outside=$(grep -v "^$prefix/" "$DIR/install_manifest.txt" || true)
[ -z "$outside" ] || { echo "package.sh: an install into $prefix wrote outside it: $outside" >&2; fail=1; }
[ -f "$prefix/etc/rdmabroker/broker.yaml" ] || { echo "package.sh: no etc/rdmabroker/broker.yaml under the prefix" >&2; fail=1; }
# The installed library as a consumer sees it: a C++ program built with
# find_package(rdmabroker), a C program with pkg-config, both run against the
# installed broker over TCP; and both binaries answer --version.
check_consumers() {
  local out=$1 port=$((20000 + RANDOM % 20000)) broker rc=0
  cmake -S tests/consumer -B "$out" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$out.log" 2>&1 &&
    ninja -C "$out" >>"$out.log" 2>&1 || { cat "$out.log" >&2; echo "package.sh: find_package(rdmabroker) consumer did not build" >&2; return 1; }
  local pc
  pc=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs rdmabroker) &&
    cc -std=c11 -Wall -Wextra -Werror tests/consumer/consumer.c $pc -o "$out/consumer_c" ||
    { echo "package.sh: pkg-config rdmabroker consumer did not build" >&2; return 1; }
  "$prefix/sbin/rdmabrokerd" --config "$prefix/etc/rdmabroker/broker.yaml" --rdma off --listen 127.0.0.1 \
    --tcp-port "$port" --metrics-listen "" --admin-socket "$out/admin.sock" --allow-anonymous --log-level warn &
  broker=$!
  for _ in $(seq 100); do [ -S "$out/admin.sock" ] && break; sleep 0.1; done
  [ "$(LD_LIBRARY_PATH="$prefix/lib" "$out/consumer_cpp" "tcp://127.0.0.1:$port")" = "hello from C++" ] ||
    { echo "package.sh: the find_package consumer did not get its message" >&2; rc=1; }
  [ "$(LD_LIBRARY_PATH="$prefix/lib" "$out/consumer_c" "tcp://127.0.0.1:$port")" = "hello from C" ] ||
    { echo "package.sh: the pkg-config consumer did not get its message" >&2; rc=1; }
  kill "$broker" && wait "$broker" || true
  for b in sbin/rdmabrokerd bin/rdmabroker; do
    LD_LIBRARY_PATH="$prefix/lib" "$prefix/$b" --version | grep -qx "${b#*/} [0-9.]*" ||
      { echo "package.sh: $b --version does not say its version" >&2; rc=1; }
  done
  return $rc
}
consumers=$(mktemp -d)
check_consumers "$consumers" || fail=1
rm -rf "$prefix" "$consumers" "$consumers.log"
# A package's paths: prefix /usr (the library in the multiarch directory) and
# the configuration in /etc. Only install paths change: nothing recompiles.
cmake -S . -B "$DIR" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc -DCMAKE_INSTALL_LIBDIR=lib/"$(gcc -print-multiarch)" >/dev/null
ninja -C "$DIR" >/dev/null
(cd "$DIR" && cpack -G DEB >/dev/null)
DEB=$(ls -t "$DIR"/rdmabroker_*.deb | head -1)
contents=$(dpkg-deb -c "$DEB" | awk '{print $6}')
for f in ./usr/sbin/rdmabrokerd ./usr/bin/rdmabroker "./usr/lib/$(gcc -print-multiarch)/librdmabroker.so.0" ./etc/rdmabroker/broker.yaml \
         ./usr/lib/systemd/system/rdmabrokerd.service ./usr/lib/sysusers.d/rdmabroker.conf \
         ./usr/lib/tmpfiles.d/rdmabroker.conf ./usr/share/doc/rdmabroker/operations.md \
         ./usr/include/rdmabroker/client.hpp ./usr/include/rdmabroker/rdmabroker.h \
         ./usr/share/man/man8/rdmabrokerd.8.gz ./usr/share/man/man1/rdmabroker.1.gz \
         ./usr/share/man/man5/rdmabroker.yaml.5.gz ./usr/lib/python3/dist-packages/rdmabroker/__init__.py \
         "./usr/lib/$(gcc -print-multiarch)/pkgconfig/rdmabroker.pc" \
         "./usr/lib/$(gcc -print-multiarch)/cmake/rdmabroker/rdmabrokerConfig.cmake"; do
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
