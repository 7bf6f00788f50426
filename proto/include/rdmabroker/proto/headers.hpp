// SPDX-License-Identifier: Apache-2.0
// Message headers (SPEC.md §3.6): the header block that a PUBLISH of protocol
// version 2 may carry at the start of its payload, NATS-style "Name: value"
// lines. Pure computation on byte spans, like wire.hpp, which uses it to
// check a frame's block and to write one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace rdmabroker::proto {

/// The longest header block: header_len is a u16 and a multiple of 8.
inline constexpr std::size_t kMaxHeaderBlock = 65528;

/// One header field as the application gives or gets it.
struct HeaderField {
  std::string_view name;
  std::string_view value;
};

/// A name: 1 or more bytes of printable ASCII (0x21..0x7e) except ':'.
inline bool valid_header_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f || c == ':') return false;
  }
  return true;
}

/// A value: any bytes (UTF-8 text, spaces) except NUL, CR and LF; may be empty.
inline bool valid_header_value(std::string_view value) {
  for (char c : value) {
    if (c == '\0' || c == '\r' || c == '\n') return false;
  }
  return true;
}

/// Bytes of the lines for `fields`, before padding.
inline std::size_t header_text_len(std::span<const HeaderField> fields) {
  std::size_t n = 0;
  for (const auto& f : fields) n += f.name.size() + 2 + f.value.size() + 2;  // "name: value\r\n"
  return n;
}

/// Bytes of the header block for `fields`: the lines padded to a multiple of
/// 8 (0 without fields: no block at all).
inline std::size_t header_block_len(std::span<const HeaderField> fields) {
  return (header_text_len(fields) + 7) & ~std::size_t{7};
}

/// Writes the block for `fields` (which must be valid) at `out`, which has
/// header_block_len(fields) bytes. Returns the bytes written.
inline std::size_t encode_header_block(std::byte* out, std::span<const HeaderField> fields) {
  auto put = [&out](std::string_view s) {
    if (!s.empty()) std::memcpy(out, s.data(), s.size());
    out += s.size();
  };
  const std::byte* start = out;
  for (const auto& f : fields) {
    put(f.name);
    put(": ");
    put(f.value);
    put("\r\n");
  }
  const auto text = static_cast<std::size_t>(out - start);
  const std::size_t len = (text + 7) & ~std::size_t{7};
  std::memset(out, 0, len - text);
  return len;
}

/// Calls `fn(name, value)` for each field of a received block, in order.
/// Returns false, having called `fn` for the fields before it, when the block
/// breaks SPEC.md §3.6: a length that is 0 or not a multiple of 8, a line
/// without ": " after a valid name or without CR LF, a value with NUL/CR/LF,
/// no field at all, or padding that is not zero or longer than alignment needs.
template <typename Fn>
bool for_each_header(std::span<const std::byte> block, Fn&& fn) {
  if (block.empty() || block.size() % 8 != 0) return false;
  // One pass, byte by byte: every client parses every delivered block.
  const char* p = reinterpret_cast<const char*>(block.data());
  const std::size_t n = block.size();
  std::size_t pos = 0;
  std::size_t fields = 0;
  while (pos < n && p[pos] != '\0') {
    const std::size_t name_at = pos;
    for (; pos < n && p[pos] != ':'; ++pos) {
      const auto u = static_cast<unsigned char>(p[pos]);
      if (u <= 0x20 || u >= 0x7f) return false;
    }
    if (pos == name_at || pos + 1 >= n || p[pos + 1] != ' ') return false;
    const std::string_view name(p + name_at, pos - name_at);
    pos += 2;
    const std::size_t value_at = pos;
    for (; pos < n && p[pos] != '\r'; ++pos) {
      if (p[pos] == '\0' || p[pos] == '\n') return false;
    }
    if (pos + 1 >= n || p[pos + 1] != '\n') return false;
    fn(name, std::string_view(p + value_at, pos - value_at));
    ++fields;
    pos += 2;
  }
  // The padding: zero bytes up to the next multiple of 8, no more.
  if (fields == 0 || n - pos >= 8) return false;
  for (; pos < n; ++pos) {
    if (p[pos] != '\0') return false;
  }
  return true;
}

inline bool valid_header_block(std::span<const std::byte> block) {
  return for_each_header(block, [](std::string_view, std::string_view) {});
}

}  // namespace rdmabroker::proto
