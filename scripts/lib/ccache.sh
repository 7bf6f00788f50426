# SPDX-License-Identifier: Apache-2.0
# Sourced by the build scripts: sets CCACHE_ARGS to the CMake arguments that
# compile through ccache when it is installed (scripts/install-deps.sh
# installs it), and exports its settings. ccache hashes paths relative to the
# checkout, so a second clone (CI's) hits what the first one compiled.
CCACHE_ARGS=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
  CCACHE_ARGS=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
