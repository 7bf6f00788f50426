#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What CPack 3.25 cannot write into the .debs, done after it (scripts/package.sh):
#   - Multi-Arch: same on librdmabroker0, so the library of several
#     architectures installs side by side (its files are in the multiarch
#     directory or identical across architectures);
#   - a -dbgsym package beside each package with ELF files, as Debian's
#     dh_strip makes them: the debug information of the build tree's
#     unstripped binaries under /usr/lib/debug/.build-id/, matched to the
#     stripped ones by build id (CPack's own dbgsym packages fail lintian).
#   scripts/lib/finish-debs.sh BUILD_DIR VERSION DEB...   (prints the .ddebs)
set -euo pipefail
DIR=$1 V=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The unstripped binaries, as the build tree installs them.
DESTDIR="$work/unstripped" cmake --install "$DIR" >/dev/null

# add_control_field DEB FIELD VALUE: rebuilds DEB with FIELD in its control file.
add_control_field() {
  local deb=$1 field=$2 value=$3 tree="$work/repack"
  rm -rf "$tree"
  dpkg-deb -R "$deb" "$tree"
  grep -q "^$field:" "$tree/DEBIAN/control" ||
    sed -i "/^Architecture:/a $field: $value" "$tree/DEBIAN/control"
  dpkg-deb --root-owner-group -Zxz -b "$tree" "$deb" >/dev/null
}

for deb in "$@"; do
  pkg=$(dpkg-deb -f "$deb" Package)
  arch=$(dpkg-deb -f "$deb" Architecture)
  [ "$pkg" = librdmabroker0 ] && add_control_field "$deb" Multi-Arch same
  [ "$arch" = all ] && continue
  root="$work/dbgsym-$pkg"
  mkdir -p "$root/DEBIAN"
  ids=()
  while read -r path; do
    path=${path#.}
    [ -f "$work/unstripped$path" ] && [ ! -L "$work/unstripped$path" ] || continue
    readelf -h "$work/unstripped$path" >/dev/null 2>&1 || continue  # ELF files only
    id=$(readelf -n "$work/unstripped$path" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
    [ -n "$id" ] || { echo "finish-debs: $path has no build id" >&2; exit 1; }
    dbg="$root/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
    mkdir -p "$(dirname "$dbg")"
    objcopy --only-keep-debug --compress-debug-sections "$work/unstripped$path" "$dbg"
    chmod 0644 "$dbg"
    ids+=("$id")
  done < <(dpkg-deb -c "$deb" | awk '$1 ~ /^-/ {print $6}')
  [ ${#ids[@]} -gt 0 ] || continue
  mkdir -p "$root/usr/share/doc"
  ln -s "$pkg" "$root/usr/share/doc/$pkg-dbgsym"
  cat >"$root/DEBIAN/control" <<CONTROL
Package: $pkg-dbgsym
Source: rdmabroker
Version: $V
Auto-Built-Package: debug-symbols
Architecture: $arch
Maintainer: $(dpkg-deb -f "$deb" Maintainer)
Installed-Size: $(du -sk "$root/usr" | cut -f1)
Depends: $pkg (= $V)
$([ "$pkg" = librdmabroker0 ] && echo "Multi-Arch: same")
Section: debug
Priority: optional
Description: debug symbols for $pkg
Build-Ids: ${ids[*]}
CONTROL
  sed -i '/^$/d' "$root/DEBIAN/control"
  out="$DIR/${pkg}-dbgsym_${V}_${arch}.ddeb"
  dpkg-deb --root-owner-group -Zxz -b "$root" "$out" >/dev/null
  echo "$out"
done
