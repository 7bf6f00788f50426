#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints the Debian symbols file (deb-symbols(5)) of a built librdmabroker:
# every symbol it exports (client-lib/librdmabroker.map: the C API and the C++
# API of the public headers; C++ ones mangled, `c++filt` reads them), each
# with the version that introduced it (new ones: the project's version).
#   scripts/symbols.sh LIBRARY [OLD_SYMBOLS_FILE] > deploy/debian/lib/symbols
# scripts/package.sh compares the packaged library with the committed file:
# a symbol added or removed fails there until the file is updated with this.
set -euo pipefail
lib=$1 old=${2:-}
version=$(sed -n 's/^project(rdmabroker VERSION \([0-9.]*\).*/\1/p' "$(dirname "$0")/../CMakeLists.txt")
echo "librdmabroker.so.0 librdmabroker0 #MINVER#"
echo "* Build-Depends-Package: librdmabroker-dev"
nm -D --defined-only --with-symbol-versions "$lib" | awk '{print $3}' | while read -r sym; do
  line="${sym%%@*}@${sym##*@}"
  since=$version
  if [ -n "$old" ]; then
    prev=$(grep -F " $line " "$old" | awk '{print $NF}' || true)
    [ -z "$prev" ] || since=$prev
  fi
  echo " $line $since"
done | LC_ALL=C sort -u
