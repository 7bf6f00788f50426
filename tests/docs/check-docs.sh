#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The reference pages agree with the programs, and the manual pages made from
# them are sound:
#   - every option that `rdmabrokerd --help` lists is in docs/rdmabrokerd.md's
#     OPTIONS, and every option listed there exists;
#   - the same for each `rdmabroker` command: its options (in its section of
#     docs/cli.md, or in COMMON OPTIONS) against `rdmabroker COMMAND --help`,
#     and every command is documented;
#   - each manual page has a NAME line and renders without a groff warning.
#
#   tests/docs/check-docs.sh RDMABROKERD RDMABROKER MAN_DIR
set -uo pipefail
daemon=$1 cli=$2 man=$3
docs=$(cd "$(dirname "$0")/../../docs" && pwd)
failed=0
fail() {
  echo "check-docs: $*" >&2
  failed=1
}

# The long options in a --help text (CLI11 prints "  -s,--server TEXT ...").
help_options() { "$@" --help | grep -oE '^ +(-[a-zA-Z],)?--[a-z][a-z0-9-]*' | grep -oE -- '--[a-z0-9-]+' | sort -u; }
# The long options named at the start of the list items of a markdown section.
doc_options() {  # FILE HEADING (the section runs to the next heading)
  local file=$1 heading=$2
  awk -v h="$heading" '
    $0 == h { on = 1; next }
    on && /^#+ / { exit }
    on && /^- `/ { print }' "$file" |
    sed -E 's/^- ((`-[a-zA-Z]`, )?`--[a-z0-9-]+`(, `--[a-z0-9-]+`)*).*/\1/' | grep -oE -- '--[a-z0-9-]+' | sort -u
}
compare() {  # WHAT HELP_LIST DOC_LIST
  local what=$1
  comm -23 <(echo "$2") <(echo "$3") | while read -r o; do
    [ -n "$o" ] && echo "check-docs: $what: $o is in --help but not documented" >&2 && echo x
  done | grep -q x && failed=1
  comm -13 <(echo "$2") <(echo "$3") | while read -r o; do
    [ -n "$o" ] && echo "check-docs: $what: $o is documented but not in --help" >&2 && echo x
  done | grep -q x && failed=1
  return 0
}

compare "rdmabrokerd (docs/rdmabrokerd.md)" "$(help_options "$daemon")" \
  "$(doc_options "$docs/rdmabrokerd.md" "## OPTIONS")"

common=$(doc_options "$docs/cli.md" "## COMMON OPTIONS")
commands=$("$cli" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
[ -n "$commands" ] || fail "rdmabroker --help lists no command"
for c in $commands; do
  grep -qx "### $c" "$docs/cli.md" || { fail "rdmabroker $c has no section in docs/cli.md"; continue; }
  own=$(doc_options "$docs/cli.md" "### $c")
  helped=$(help_options "$cli" "$c")
  # A command's --help lists the common options too (if it takes them).
  if grep -qx -- "--server" <<<"$helped"; then
    documented=$(sort -u <(echo "$own") <(echo "$common") | grep .)
  else
    documented=$( (echo "$own"; echo "--help") | sort -u | grep .)
  fi
  compare "rdmabroker $c (docs/cli.md)" "$helped" "$documented"
  # A command with commands of its own (stream add, ...): a section each.
  for s in $("$cli" "$c" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }'); do
    grep -qx "#### $c $s" "$docs/cli.md" || { fail "rdmabroker $c $s has no section in docs/cli.md"; continue; }
    compare "rdmabroker $c $s (docs/cli.md)" "$(help_options "$cli" "$c" "$s")" \
      "$( (doc_options "$docs/cli.md" "#### $c $s"; echo "--help") | sort -u | grep .)"
  done
done

for page in rdmabrokerd.8 rdmabroker.1 rdmabroker.yaml.5; do
  f=$man/$page.gz
  [ -f "$f" ] || { fail "$f is missing (is go-md2man installed?)"; continue; }
  zcat "$f" | grep -q '^\.SH NAME' || fail "$page has no NAME section"
  warnings=$(zcat "$f" | preconv | groff -man -t -ww -z 2>&1)
  [ -z "$warnings" ] || fail "$page: groff warns: $warnings"
done

[ "$failed" = 0 ] && echo "check-docs: docs/rdmabrokerd.md, docs/cli.md and the manual pages agree with --help"
exit "$failed"
