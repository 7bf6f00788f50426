#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the Debian packages from a build tree and checks them:
#   scripts/package.sh [BUILD_DIR]   (default build/release)
# The packages (deploy/debian/packages.cmake): rdmabroker (the daemon),
# rdmabroker-clients (the CLI), librdmabroker0, librdmabroker-dev and
# python3-rdmabroker. Checks what each holds and states in its control file,
# runs lintian on them (every tag that remains is justified in an override),
# and builds and runs a C++ and a C consumer against them unpacked into a
# throw-away root. Prints the packages' paths on the last line. test.sh runs
# it, so a package that lost its unit, its conffile, its maintainer scripts or
# a file a consumer needs fails CI; the systemd suite installs them.
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
#   check_consumers OUT PREFIX LIBDIR ETC
check_consumers() {
  local out=$1 prefix=$2 libdir=$3 etc=$4 port=$((20000 + RANDOM % 20000)) broker rc=0
  # The C++ consumer at the compiler's default standard (C++17) and at C++20.
  cmake -S tests/consumer -B "$out.cxx20" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_STANDARD=20 >"$out.log" 2>&1 &&
    ninja -C "$out.cxx20" >>"$out.log" 2>&1 || { cat "$out.log" >&2; echo "package.sh: find_package(rdmabroker) consumer did not build at C++20" >&2; return 1; }
  cmake -S tests/consumer -B "$out" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >"$out.log" 2>&1 &&
    ninja -C "$out" >>"$out.log" 2>&1 || { cat "$out.log" >&2; echo "package.sh: find_package(rdmabroker) consumer did not build at the default standard" >&2; return 1; }
  [ "$(LD_LIBRARY_PATH="$prefix/$libdir" "$out/consumer_cpp" --standard)" = 201703 ] &&
    [ "$(LD_LIBRARY_PATH="$prefix/$libdir" "$out.cxx20/consumer_cpp" --standard)" = 202002 ] ||
    { echo "package.sh: the consumers were not built at C++17 and C++20" >&2; return 1; }
  local pc
  pc=$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs rdmabroker) &&
    cc -std=c11 -Wall -Wextra -Werror tests/consumer/consumer.c $pc -o "$out/consumer_c" ||
    { echo "package.sh: pkg-config rdmabroker consumer did not build" >&2; return 1; }
  # The broker links librdmabroker too (its routes to other brokers), found
  # here like the consumers' (a package's is in the linker's default path).
  LD_LIBRARY_PATH="$prefix/$libdir" "$prefix/sbin/rdmabrokerd" --config "$etc/rdmabroker/broker.yaml" --rdma off --listen 127.0.0.1 \
    --tcp-port "$port" --metrics-listen "" --admin-socket "$out/admin.sock" --allow-anonymous --log-level warn &
  broker=$!
  for _ in $(seq 100); do [ -S "$out/admin.sock" ] && break; sleep 0.1; done
  for exe in "$out/consumer_cpp" "$out.cxx20/consumer_cpp"; do
    [ "$(LD_LIBRARY_PATH="$prefix/$libdir" "$exe" "tcp://127.0.0.1:$port")" = "hello from C++" ] ||
      { echo "package.sh: the find_package consumer $exe did not get its message" >&2; rc=1; }
  done
  [ "$(LD_LIBRARY_PATH="$prefix/$libdir" "$out/consumer_c" "tcp://127.0.0.1:$port")" = "hello from C" ] ||
    { echo "package.sh: the pkg-config consumer did not get its message" >&2; rc=1; }
  kill "$broker" && wait "$broker" || true
  for b in sbin/rdmabrokerd bin/rdmabroker; do
    LD_LIBRARY_PATH="$prefix/$libdir" "$prefix/$b" --version | grep -qx "${b#*/} [0-9.]*" ||
      { echo "package.sh: $b --version does not say its version" >&2; rc=1; }
  done
  return $rc
}
rm -rf "$prefix"
# A package's paths: prefix /usr (the library in the multiarch directory) and
# the configuration in /etc. Only install paths change: nothing recompiles.
multiarch=$(gcc -print-multiarch)
cmake -S . -B "$DIR" -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc -DCMAKE_INSTALL_LIBDIR=lib/"$multiarch" >/dev/null
ninja -C "$DIR" >/dev/null
rm -f "$DIR"/*.deb
rm -f "$DIR"/*.ddeb
(cd "$DIR" && cpack -G DEB >/dev/null)
V=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$DIR/CMakeCache.txt")
deb() { echo "$DIR/${1}_${V}_$([ "$1" = python3-rdmabroker ] && echo all || dpkg --print-architecture).deb"; }
# Multi-Arch and the -dbgsym packages (.ddeb), which cpack cannot make.
mapfile -t ddebs < <(scripts/lib/finish-debs.sh "$DIR" "$V" "$DIR"/*.deb)
for p in rdmabroker rdmabroker-clients librdmabroker0; do
  d="$DIR/${p}-dbgsym_${V}_$(dpkg --print-architecture).ddeb"
  [ -f "$d" ] || { echo "package.sh: no $d" >&2; fail=1; continue; }
  # Its debug file is the one of the stripped binary's build id.
  dpkg-deb -f "$d" Build-Ids | grep -qE '^[0-9a-f]{40}' || { echo "package.sh: $d names no build id" >&2; fail=1; }
  grep -q '/usr/lib/debug/.build-id/.*\.debug$' <<<"$(dpkg-deb -c "$d")" || { echo "package.sh: $d holds no debug file" >&2; fail=1; }
done
L=./usr/lib/$multiarch
declare -A files=(
  [rdmabroker]="./usr/sbin/rdmabrokerd ./etc/rdmabroker/broker.yaml ./usr/lib/systemd/system/rdmabrokerd.service
    ./usr/lib/sysusers.d/rdmabroker.conf ./usr/lib/tmpfiles.d/rdmabroker.conf ./usr/share/doc/rdmabroker/operations.md
    ./usr/share/man/man8/rdmabrokerd.8.gz ./usr/share/man/man5/rdmabroker.yaml.5.gz"
  [rdmabroker-clients]="./usr/bin/rdmabroker ./usr/share/man/man1/rdmabroker.1.gz"
  [librdmabroker0]="$L/librdmabroker.so.0 $L/librdmabroker.so.$V"
  [librdmabroker-dev]="./usr/include/rdmabroker/client.hpp ./usr/include/rdmabroker/rdmabroker.h $L/librdmabroker.so
    $L/pkgconfig/rdmabroker.pc $L/cmake/rdmabroker/rdmabrokerConfig.cmake"
  [python3-rdmabroker]="./usr/lib/python3/dist-packages/rdmabroker/__init__.py ./usr/lib/python3/dist-packages/rdmabroker/aio.py"
)
# What each control file must say.
declare -A control=(
  [rdmabroker]="Depends: .*rdma-core|Depends: .*libibverbs1|Recommends: rdmabroker-clients"
  [rdmabroker-clients]="Depends: librdmabroker0 (= $V)"
  [librdmabroker0]="Section: libs|Multi-Arch: same"
  [librdmabroker-dev]="Depends: librdmabroker0 (= $V)|Section: libdevel"
  [python3-rdmabroker]="Depends: python3:any, librdmabroker0 (>= $V)|Architecture: all"
)
declare -A scripts=([rdmabroker]="conffiles postinst prerm postrm" [librdmabroker0]="shlibs symbols triggers"
                    [python3-rdmabroker]="postinst prerm")
debs=()
for p in "${!files[@]}"; do
  f=$(deb "$p")
  [ -f "$f" ] || { echo "package.sh: cpack made no $f" >&2; fail=1; continue; }
  debs+=("$f")
  contents=$(dpkg-deb -c "$f" | awk '{print $6}')
  for want in ${files[$p]} ./usr/share/doc/$p/copyright ./usr/share/doc/$p/changelog.gz; do
    grep -qx -- "$want" <<<"$contents" || { echo "package.sh: $p lacks $want" >&2; fail=1; }
  done
  info=$(dpkg-deb -I "$f")
  IFS='|' read -ra wants <<<"${control[$p]}"
  for want in "${wants[@]}" ${scripts[$p]:-}; do
    grep -q -- "$want" <<<"$info" || { echo "package.sh: $p's control lacks '$want'" >&2; fail=1; }
  done
done
[ "$(ls "$DIR"/*.deb | wc -l)" = "${#files[@]}" ] || { echo "package.sh: cpack made packages not checked here: $(ls "$DIR"/*.deb)" >&2; fail=1; }
[ "$(dpkg-deb --ctrl-tarfile "$(deb rdmabroker)" | tar -xO ./conffiles)" = /etc/rdmabroker/broker.yaml ] ||
  { echo "package.sh: broker.yaml is not a conffile" >&2; fail=1; }
# The unit runs the packaged daemon, and reloads with it: nothing from
# rdmabroker-clients (only Recommended) is needed for `systemctl reload`.
unit=$(dpkg-deb --fsys-tarfile "$(deb rdmabroker)" | tar -xO ./usr/lib/systemd/system/rdmabrokerd.service)
for want in "ExecStart=/usr/sbin/rdmabrokerd --config /etc/rdmabroker/broker.yaml" \
  "ExecReload=/usr/sbin/rdmabrokerd --reload --admin-socket /run/rdmabroker/admin.sock"; do
  grep -qxF -- "$want" <<<"$unit" || { echo "package.sh: the unit lacks '$want'" >&2; fail=1; }
done
[ "$(dpkg-deb --ctrl-tarfile "$(deb librdmabroker0)" | tar -xO ./shlibs)" = "librdmabroker 0 librdmabroker0 (>= $V)" ] ||
  { echo "package.sh: librdmabroker0's shlibs does not name it" >&2; fail=1; }
# The exported API is what the symbols file says: a symbol added or removed
# (an ABI change) fails here until deploy/debian/lib/symbols is regenerated.
lib_root=$(mktemp -d)
dpkg-deb -x "$(deb librdmabroker0)" "$lib_root"
if ! diff -u deploy/debian/lib/symbols <(scripts/symbols.sh "$lib_root/usr/lib/$multiarch/librdmabroker.so.0" deploy/debian/lib/symbols) >&2; then
  echo "package.sh: librdmabroker's exports differ from deploy/debian/lib/symbols (scripts/symbols.sh LIB OLD > NEW)" >&2
  fail=1
fi
rm -rf "$lib_root"
# lintian: errors and warnings fail; what remains is overridden with a reason
# (deploy/debian/*/lintian-overrides) or listed in docs/operations.md.
if ! lintian --fail-on error,warning "${debs[@]}" "${ddebs[@]}" >"$DIR/lintian.log" 2>&1; then
  cat "$DIR/lintian.log" >&2
  echo "package.sh: lintian found errors or warnings" >&2
  fail=1
fi
# The packages as a consumer gets them: unpacked into a throw-away root, a
# C++ and a C program built against librdmabroker-dev, run against the
# packaged daemon.
root=$(mktemp -d)
for f in "${debs[@]}"; do dpkg-deb -x "$f" "$root"; done
consumers=$(mktemp -d)
check_consumers "$consumers" "$root/usr" "lib/$multiarch" "$root/etc" || fail=1
rm -rf "$root" "$consumers" "$consumers.log" "$consumers.cxx20"
# The tree is configured for the packages now (/usr, /etc): an install with
# another prefix still stays inside it (the configuration in PREFIX/etc).
prefix=$(mktemp -d)
cmake --install "$DIR" --prefix "$prefix" >/dev/null
outside=$(grep -v "^$prefix/" "$DIR/install_manifest.txt" || true)
[ -z "$outside" ] || { echo "package.sh: after packaging, an install into $prefix wrote outside it: $outside" >&2; fail=1; }
[ -f "$prefix/etc/rdmabroker/broker.yaml" ] || { echo "package.sh: after packaging, no etc/rdmabroker/broker.yaml under the prefix" >&2; fail=1; }
rm -rf "$prefix"
[ $fail = 0 ] || exit 1
echo "${debs[@]}"
