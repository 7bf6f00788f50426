#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs every Debian 12 package that building, testing and the Soft-RoCE
# guest need (--bench: and what the benchmark suite compares with). Idempotent: packages already installed are not touched, and
# apt-get update runs only when something is missing.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake pkg-config ninja-build ccache clang-format
  libibverbs-dev librdmacm-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libyaml-cpp-dev prometheus-cpp-dev libsystemd-dev libssl-dev liburiparser-dev
  libisal-dev  # CRC32C of stored messages (daemon/store/crc32c.hpp)
  go-md2man groff-base  # the manual pages, made from docs/ (scripts/man.sh) and checked with groff
  lintian  # scripts/package.sh checks the Debian packages with it
  mmdebstrap umoci  # scripts/image.sh: the container image's root file system and OCI layout
  # tests
  libgtest-dev libgmock-dev libbenchmark-dev
  stress-ng  # scripts/flake-loop.sh: the host suite under load
  gdb  # tests/rdma/harness.cpp: the stacks of a program that hangs
  python3 python3-pytest  # the Python package's tests (python/tests)
  python3-venv python3-pip python3-setuptools python3-wheel  # tests/python-wheel.sh: pip install of a wheel
  clang libclang-rt-14-dev  # libFuzzer targets (tests/fuzz)
  libnats-dev libhiredis-dev  # the NATS and Redis drivers of the benchmark suite (built with the tests)
  liburing-dev  # tests/bench/append_sync: write+fdatasync against io_uring (docs/streams.md)
  prometheus  # promtool, to check the metrics a live broker serves
  # the Soft-RoCE guest (tests/softroce/run-in-guest.sh) and RDMA tools used in it
  qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest
  iproute2 kmod cpio gzip xz-utils perl util-linux
)

# --bench: also what tests/bench/suite.sh runs against and plots with. Not in
# the default set: the server packages start system services on install.
if [ "${1:-}" = --bench ]; then
  PACKAGES+=(nats-server redis-server gnuplot-nox python3)
fi

if [ "$(id -u)" != 0 ]; then
  echo "install-deps: must run as root (apt-get)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
