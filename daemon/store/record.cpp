// SPDX-License-Identifier: Apache-2.0
#include "store/record.hpp"

#include <cstring>

#include "store/crc32c.hpp"

namespace rdmabroker::daemon::store {
namespace {

struct Header {
  std::uint32_t length;
  std::uint32_t crc;
  std::uint64_t sequence;
  std::int64_t time_ns;
  std::uint16_t subject_len;
  std::uint16_t flags;
  std::uint32_t headers_len;
};
static_assert(sizeof(Header) == kRecordHeaderBytes);

constexpr std::size_t kCrcFrom = offsetof(Header, sequence);

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace

std::size_t record_length(const MessageParts& m) {
  return kRecordHeaderBytes + m.subject.size() + m.headers.size() + m.payload.size();
}

std::array<std::byte, kRecordHeaderBytes> encode_header(std::uint64_t sequence, std::int64_t time_ns,
                                                        const MessageParts& m) {
  Header h{};
  h.length = static_cast<std::uint32_t>(record_length(m));
  h.sequence = sequence;
  h.time_ns = time_ns;
  h.subject_len = static_cast<std::uint16_t>(m.subject.size());
  h.headers_len = static_cast<std::uint32_t>(m.headers.size());
  std::array<std::byte, kRecordHeaderBytes> out{};
  std::memcpy(out.data(), &h, sizeof h);
  std::uint32_t crc = crc32c(std::span(out).subspan(kCrcFrom));
  crc = crc32c(as_bytes(m.subject), crc);
  crc = crc32c(m.headers, crc);
  h.crc = crc32c(m.payload, crc);
  std::memcpy(out.data() + offsetof(Header, crc), &h.crc, sizeof h.crc);
  return out;
}

ParseOutcome parse_record(std::span<const std::byte> bytes, RecordView& out, std::size_t& length) {
  if (bytes.size() < kRecordHeaderBytes) return ParseOutcome::kShort;
  Header h{};
  std::memcpy(&h, bytes.data(), sizeof h);
  const std::size_t body = std::size_t{h.subject_len} + h.headers_len;
  if (h.length < kRecordHeaderBytes + body || h.length > kMaxRecordBytes || h.flags != 0 || h.sequence == 0) {
    return ParseOutcome::kBad;
  }
  length = h.length;
  if (bytes.size() < h.length) return ParseOutcome::kShort;
  if (crc32c(bytes.subspan(kCrcFrom, h.length - kCrcFrom)) != h.crc) return ParseOutcome::kBad;
  const auto* p = bytes.data() + kRecordHeaderBytes;
  out.sequence = h.sequence;
  out.time_ns = h.time_ns;
  out.subject = std::string_view(reinterpret_cast<const char*>(p), h.subject_len);
  out.headers = bytes.subspan(kRecordHeaderBytes + h.subject_len, h.headers_len);
  out.payload = bytes.subspan(kRecordHeaderBytes + body, h.length - kRecordHeaderBytes - body);
  return ParseOutcome::kOk;
}

}  // namespace rdmabroker::daemon::store
