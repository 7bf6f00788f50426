// SPDX-License-Identifier: Apache-2.0
// One stored message as it lies in a segment file (docs/streams.md,
// "Storage"): a 32-byte header, then the subject, the header block and the
// payload. The header starts with the record's length and a CRC32C of
// everything after the CRC field, so a reader finds the next record without
// an index and tells a torn or flipped record from a good one.
//
//   0  u32 length        the whole record, header included
//   4  u32 crc32c        of bytes 8 .. length
//   8  u64 sequence      the stream's, from 1; never reused
//  16  i64 time_ns       the broker's receive time (CLOCK_REALTIME), never
//                        before the previous record's
//  24  u16 subject_len
//  26  u16 flags         0 (reserved)
//  28  u32 headers_len   the message's header block (proto/SPEC.md §3.6), as received
//  32  subject, header block, payload
//
// Little-endian, as every host this daemon builds for.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace rdmabroker::daemon::store {

static_assert(std::endian::native == std::endian::little,
              "records are little-endian, written as the CPU holds them");

inline constexpr std::size_t kRecordHeaderBytes = 32;
/// No record is larger: a length above it is a damaged one, not a message.
inline constexpr std::size_t kMaxRecordBytes = std::size_t{1} << 30;

/// A message to store.
struct MessageParts {
  std::string_view subject;
  std::span<const std::byte> headers;  // the encoded header block, or empty
  std::span<const std::byte> payload;
};

/// A record read back: views into the buffer it was read into.
struct RecordView {
  std::uint64_t sequence = 0;
  std::int64_t time_ns = 0;
  std::string_view subject;
  std::span<const std::byte> headers;
  std::span<const std::byte> payload;
};

/// The length of a record holding `m`.
std::size_t record_length(const MessageParts& m);

/// The 32-byte header of the record for `m` (its CRC covers `m`'s bytes too).
std::array<std::byte, kRecordHeaderBytes> encode_header(std::uint64_t sequence, std::int64_t time_ns,
                                                        const MessageParts& m);

enum class ParseOutcome {
  kOk,
  kShort,  // `bytes` ends before the record does (a torn tail, or read more)
  kBad,    // an impossible length or field, or the CRC does not match
};

/// Reads the record at the start of `bytes` into `out` (views into `bytes`)
/// and its length into `length` (kOk and kShort, once the header is there).
ParseOutcome parse_record(std::span<const std::byte> bytes, RecordView& out, std::size_t& length);

}  // namespace rdmabroker::daemon::store
