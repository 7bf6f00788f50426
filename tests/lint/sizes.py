#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sizes a reader can hold (docs/architecture.md, "Sizes"): no product
source file over 600 lines, no function over 80. Product sources: daemon/,
client-lib/, common/, proto/, config/ and the Python package; tests and
benchmarks are not measured. A function is a definition that starts at the
first column (Google style: free functions and out-of-line members) and
ends at the brace in that column; in Python, a `def` and its indented body.
A declaration table may be exempted below by name, with the reason beside it.

Prints each file or function over its bound; exits 1 if there is one."""
import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
ROOTS = ["daemon", "client-lib", "common", "proto", "config", "python/rdmabroker"]
SOURCE = (".cpp", ".hpp", ".h", ".c", ".py")
# file:function -> why it may be longer: declarations, one line per item.
EXEMPT = {
    "config/src/config.cpp:fields": "the settings table: one entry per YAML key (docs/configuration.md)",
    "daemon/worker/worker_stats.cpp:WorkerStats::visit": "the statistics table: one declaration per series",
}

C_START = re.compile(r"^(?!namespace\b|class\b|struct\b|enum\b|union\b|extern\b|template\b|#|//|/\*|\s)"
                     r"(?:[\w:<>,*&\s\[\]]+?\s)?[*&]*([\w:~]+(?:::operator\S+)?)\s*\(")


def c_functions(lines):
    """(name, first line, line count) of each function defined at column 0."""
    i = 0
    while i < len(lines):
        m = C_START.match(lines[i])
        if not m:
            i += 1
            continue
        # The definition's opening brace: on this line or a continuation line.
        j = i
        while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";") or lines[j].rstrip().endswith("};"):
            i = j + 1
            continue
        if lines[j].rstrip().endswith("}"):  # a one-line body
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        yield m.group(1), i + 1, k - i + 1
        i = k + 1


def py_functions(lines):
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:async\s+)?def\s+(\w+)", line)
        if not m:
            continue
        indent = len(m.group(1))
        k = i + 1
        last = i
        while k < len(lines):
            text = lines[k]
            if text.strip():
                if len(text) - len(text.lstrip()) <= indent:
                    break
                last = k
            k += 1
        yield m.group(2), i + 1, last - i + 1


def main(root):
    bad = []
    for top in ROOTS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    lines = f.read().splitlines()
                if len(lines) > MAX_FILE_LINES:
                    bad.append(f"{path}: {len(lines)} lines (at most {MAX_FILE_LINES})")
                found = py_functions(lines) if name.endswith(".py") else c_functions(lines)
                for function, first, count in found:
                    if count > MAX_FUNCTION_LINES and f"{path}:{function}" not in EXEMPT:
                        bad.append(f"{path}:{first}: {function} is {count} lines (at most {MAX_FUNCTION_LINES})")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
