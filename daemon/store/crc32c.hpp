// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli, as iSCSI and ext4 use it) over Intel's ISA-L, which
// picks the CPU's crc32 instruction when it has one. Continuable: the CRC of
// a + b is crc32c(b, crc32c(a)).
#pragma once

#include <isa-l/crc.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmabroker::daemon::store {

inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) {
  // ISA-L's crc32_iscsi takes and returns the register without the final
  // inversion; this keeps the standard's (check value of "123456789":
  // 0xE3069283, tests/unit/store_test.cpp).
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): ISA-L's signature lacks const; it only reads
  auto* p = const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>(bytes.data()));
  return ~crc32_iscsi(p, static_cast<int>(bytes.size()), ~crc);
}

}  // namespace rdmabroker::daemon::store
