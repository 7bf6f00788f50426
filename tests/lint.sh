#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Source rules a compiler cannot check, run as a unit test (ctest -L unit):
#   - memory is registered only through verbs::register_local (local access
#     only), never with remote write/atomic rights and never through a
#     memory window: no peer can reach broker or client memory with an rkey
#     (docs/security.md, "RDMA memory"); the two exceptions, remote READ of
#     a message a client offers (verbs::register_offered_message, SPEC.md
#     §3.8) and remote WRITE into a landing area a client registers for one
#     message it receives (verbs::register_landing_area, §3.9), live in
#     verbs.hpp and are called by the client library only;
#   - every C and C++ source is laid out by .clang-format (Google's style,
#     110 columns): `clang-format -i FILE` fixes one;
#   - every source file (C, C++, Python, shell, CMake) carries the line
#     `SPDX-License-Identifier: Apache-2.0` (LICENSE) in its first three lines;
#   - the daemon's folders include only lower floors, and the client's
#     transports see their session only through SessionSide
#     (tests/lint/layers.py, docs/architecture.md "Layers");
#   - no product source file over 600 lines, no function over 80
#     (tests/lint/sizes.py, docs/architecture.md "Sizes").
#   tests/lint.sh [memory|format|spdx|layers|sizes]   (no argument: all)
set -euo pipefail
cd "$(dirname "$0")/.."
RULE=${1:-all}
fail=0
SRC=(daemon client-lib common proto config)
if [ "$RULE" = all ] || [ "$RULE" = memory ]; then
hits=$(grep -rn --include='*.cpp' --include='*.hpp' --include='*.h' --include='*.c' 'ibv_reg_mr(' "${SRC[@]}" |
  grep -v '^common/include/rdmabroker/common/verbs.hpp:' || true)
if [ -n "$hits" ]; then
  echo "lint: ibv_reg_mr outside verbs::register_local:"; echo "$hits"; fail=1
fi
hits=$( (grep -rnE --include='*.cpp' --include='*.hpp' --include='*.h' --include='*.c' \
  'IBV_ACCESS_REMOTE_|IBV_ACCESS_MW_BIND|ibv_alloc_mw|ibv_bind_mw|ibv_reg_dmabuf_mr|ibv_reg_mr_iova' "${SRC[@]}" |
  grep -vE '^common/include/rdmabroker/common/verbs.hpp:[0-9]+:  (return MrPtr\(ibv_reg_mr\(pd, addr, length, IBV_ACCESS_REMOTE_READ\)\);|return MrPtr\(ibv_reg_mr\(pd, addr, length, IBV_ACCESS_LOCAL_WRITE \| IBV_ACCESS_REMOTE_WRITE\)\);|attr.qp_access_flags = write \? IBV_ACCESS_REMOTE_READ \| IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;)$'
  grep -rnE 'register_offered_message|register_landing_area|allow_remote_access' daemon) || true)
if [ -n "$hits" ]; then
  echo "lint: remote access to registered memory:"; echo "$hits"; fail=1
fi
fi
if [ "$RULE" = all ] || [ "$RULE" = format ]; then
mapfile -t sources < <(find "${SRC[@]}" tests -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c')
if ! out=$(clang-format --dry-run --Werror "${sources[@]}" 2>&1); then
  echo "lint: not formatted by .clang-format (clang-format -i FILE):"
  echo "$out" | grep -oE '^[^:]+\.(cpp|hpp|h|c):' | sort -u
  fail=1
fi
fi
if [ "$RULE" = all ] || [ "$RULE" = spdx ]; then
mapfile -t sources < <(find . -path ./build -prune -o -path ./.git -prune -o -path '*/corpus' -prune -o -type f \
  \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' -o -name '*.py' -o -name '*.sh' \
  -o -name CMakeLists.txt -o -name '*.cmake' -o -name '*.cmake.in' -o -path ./.ci/run \
  -o -path './deploy/debian/*/post*' -o -path './deploy/debian/*/pre*' \) -print)
missing=()
for f in "${sources[@]}"; do
  head -3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || missing+=("${f#./}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "lint: no 'SPDX-License-Identifier: Apache-2.0' line in the first three lines of:"
  printf '  %s\n' "${missing[@]}"
  fail=1
fi
fi
if [ "$RULE" = all ] || [ "$RULE" = layers ]; then
if ! out=$(python3 tests/lint/layers.py .); then
  echo "lint: an include runs up or sideways the daemon's layers (docs/architecture.md, \"Layers\"):"
  echo "$out"; fail=1
fi
fi
if [ "$RULE" = all ] || [ "$RULE" = sizes ]; then
if ! out=$(python3 tests/lint/sizes.py .); then
  echo "lint: too long to hold in one's head (docs/architecture.md, \"Sizes\"):"
  echo "$out"; fail=1
fi
fi
[ $fail = 0 ] && echo "lint: ok"
exit $fail
