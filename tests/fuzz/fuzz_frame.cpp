// SPDX-License-Identifier: Apache-2.0
// The frame decoder on arbitrary bytes, as a broker or client receives them
// (a whole RDMA receive buffer, or a TCP stream). Besides memory safety it
// asserts: decoded views lie inside the input; the stream scan
// (whole_frames) and the frame-by-frame decoder agree on where whole frames
// end; a decoded frame (its header block parsed into fields) re-encodes to a
// frame that decodes to the same fields;
// a DELIVER's inner frames lie inside its payload; an INFO's text that reads
// re-encodes to text that reads the same.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_check.hpp"
#include "rdmabroker/proto/info.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace proto = rdmabroker::proto;

namespace {

constexpr std::size_t kMaxFrame = 16384;  // the default broker buffer size

bool inside(std::span<const std::byte> buf, const void* p, std::size_t n) {
  const auto* b = reinterpret_cast<const std::byte*>(p);
  return n == 0 || (b >= buf.data() && b + n <= buf.data() + buf.size());
}

void check_round_trip(const proto::Frame& f) {
  // A header block (SPEC.md §3.6) that decoded parses into fields that encode
  // back to the same block.
  std::vector<proto::HeaderField> fields;
  FUZZ_CHECK(f.headers.empty() ||
             proto::for_each_header(f.headers, [&](std::string_view n, std::string_view v) {
               fields.push_back({n, v});
             }));
  FUZZ_CHECK(f.headers.size() == proto::header_block_len(fields));
  std::vector<std::byte> out(f.header.frame_len());
  const std::size_t n = proto::encode_frame(out, f.header, f.subject, f.reply, f.payload, fields);
  FUZZ_CHECK(n == out.size());
  proto::Frame again;
  FUZZ_CHECK(proto::decode_frame(out, kMaxFrame, again) == proto::DecodeStatus::kOk);
  FUZZ_CHECK(again.header.type == f.header.type && again.header.flags == f.header.flags);
  FUZZ_CHECK(again.header.arg == f.header.arg && again.header.sequence == f.header.sequence);
  FUZZ_CHECK(again.subject == f.subject && again.reply == f.reply);
  FUZZ_CHECK(again.payload.size() == f.payload.size());
  FUZZ_CHECK(f.payload.empty() || std::memcmp(again.payload.data(), f.payload.data(), f.payload.size()) == 0);
  FUZZ_CHECK(again.headers.size() == f.headers.size());
  FUZZ_CHECK(f.headers.empty() || std::memcmp(again.headers.data(), f.headers.data(), f.headers.size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> buf(reinterpret_cast<const std::byte*>(data), size);
  const std::size_t whole = proto::whole_frames(buf, kMaxFrame);
  FUZZ_CHECK(whole <= size);

  std::size_t off = 0;
  while (off < size) {
    proto::Frame f;
    const auto st = proto::decode_frame(buf.subspan(off), kMaxFrame, f);
    if (st == proto::DecodeStatus::kNeedMore) {
      FUZZ_CHECK(whole == off);  // the stream waits for the rest of this frame
      return 0;
    }
    if (st != proto::DecodeStatus::kOk) {
      FUZZ_CHECK(whole == size);  // handed to the decoder, which reports it
      (void)proto::error_for(st);
      FUZZ_CHECK(!proto::to_string(st).empty());
      return 0;
    }
    const std::size_t len = f.header.frame_len();
    FUZZ_CHECK(len >= proto::kHeaderSize && len % proto::kFrameAlign == 0 && off + len <= size);
    FUZZ_CHECK(inside(buf, f.subject.data(), f.subject.size()));
    FUZZ_CHECK(inside(buf, f.reply.data(), f.reply.size()));
    FUZZ_CHECK(inside(buf, f.payload.data(), f.payload.size()));
    FUZZ_CHECK(inside(buf, f.headers.data(), f.headers.size()));
    check_round_trip(f);
    if (f.header.type == proto::FrameType::kDeliver) {
      (void)proto::for_each_delivered(f, [&](const proto::Frame& inner) {
        FUZZ_CHECK(inner.header.type == proto::FrameType::kPublish);
        FUZZ_CHECK(inner.offset + inner.header.frame_len() <= f.payload.size());
        FUZZ_CHECK(inside(f.payload, inner.payload.data(), inner.payload.size()));
        FUZZ_CHECK(inside(f.payload, inner.subject.data(), inner.subject.size()));
      });
    }
    if (f.header.type == proto::FrameType::kInfo) {
      // An INFO that reads re-encodes (known keys only) to one that reads the same.
      const std::string_view text(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
      if (auto info = proto::decode_info(text)) {
        const std::string again = proto::encode_info(*info, 1u << 20);
        FUZZ_CHECK(proto::decode_info(again) == info);
      }
    }
    off += len;
  }
  FUZZ_CHECK(whole == size);
  return 0;
}
