#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The manual pages, made from the documentation pages they are (one source:
# docs/rdmabrokerd.md, docs/cli.md, docs/configuration.md), with go-md2man:
#
#   scripts/man.sh OUT_DIR VERSION
#
# writes OUT_DIR/rdmabrokerd.8.gz, rdmabroker.1.gz and rdmabroker.yaml.5.gz
# (gzip -9n, as Debian ships them). Each page starts at its "## NAME"
# heading; "##" headings become sections (upper case, as man pages have them)
# and "###" subsections. CMake runs this when the docs change (target man).
set -euo pipefail
out=$1 version=$2
src=$(cd "$(dirname "$0")/.." && pwd)
command -v go-md2man >/dev/null || {
  echo "man.sh: go-md2man is missing (apt-get install go-md2man; scripts/install-deps.sh does)" >&2
  exit 1
}
mkdir -p "$out"
# The date of the last change to the docs, not of the build: the same tree
# makes the same pages.
date=$(git -C "$src" log -1 --format=%cd --date=format:'%B %Y' -- docs 2>/dev/null || true)
[ -n "$date" ] || date=$(date -u +'%B %Y')

# A table as wide as the docs' key tables does not fit a terminal in roff:
# each row becomes a list item, "first cell: the others", the middle ones
# named by their column ("default 16KiB; live no: receive buffer size...").
tables_to_lists() {
  awk '
    function cells(line, out,   n, i) {
      gsub(/\\\|/, "\001", line)          # an escaped | inside a cell
      sub(/^\|[ ]*/, "", line); sub(/[ ]*\|[ ]*$/, "", line)
      n = split(line, out, /[ ]*\|[ ]*/)
      for (i = 1; i <= n; i++) gsub(/\001/, "|", out[i])
      return n
    }
    /^\|/ && !in_table { n = cells($0, head); in_table = 1; next }
    /^\|[-: |]+$/ && in_table { next }
    /^\|/ && in_table {
      m = cells($0, row)
      item = "- " row[1]
      middle = ""
      for (i = 2; i < m; i++) if (row[i] != "") middle = middle (middle == "" ? "" : "; ") head[i] " " row[i]
      if (middle != "") item = item " (" middle ")"
      if (m > 1) item = item ": " row[m]
      print item
      next
    }
    { in_table = 0; print }'
}

page() {  # SOURCE NAME SECTION MANUAL
  local source=$1 name=$2 section=$3 manual=$4
  local upper
  upper=$(echo "$name" | tr '[:lower:]' '[:upper:]')
  {
    printf '%% %s %s "%s" "rdmabroker %s" "%s"\n\n' "$upper" "$section" "$date" "$version" "$manual"
    sed -n '/^## NAME$/,$p' "$src/$source" | sed -e 's/^## \(.*\)$/# \U\1/' -e 's/^### /## /' | tables_to_lists
  } | go-md2man | gzip -9n >"$out/$name.$section.gz.tmp"
  mv "$out/$name.$section.gz.tmp" "$out/$name.$section.gz"
}

page docs/rdmabrokerd.md rdmabrokerd 8 "System Administration"
page docs/cli.md rdmabroker 1 "User Commands"
page docs/configuration.md rdmabroker.yaml 5 "File Formats"
