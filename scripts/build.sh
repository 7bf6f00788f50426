#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures and builds one build tree: scripts/build.sh DIR [cmake args...]
# The developers' and CI's build: warnings are errors, sources are compiled in
# unity batches (scripts/lib/unity.cmake: a fifth less wall time on two cores)
# and through ccache, which a second clone (CI's) hits for every batch that the
# first one compiled. CMake's own UNITY_BUILD is turned off (trees configured
# before had it on): its batches name sources by absolute path, so no clone
# hits another's.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$1
shift
# shellcheck source=scripts/lib/ccache.sh
. scripts/lib/ccache.sh
cmake -S . -B "$dir" -G Ninja -DRDMABROKER_WERROR=ON -DCMAKE_UNITY_BUILD=OFF -DRDMABROKER_UNITY_BATCH=8 \
  "${CCACHE_ARGS[@]}" "$@" >/dev/null
ninja -C "$dir"
