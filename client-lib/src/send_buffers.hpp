// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: a session's send buffers. Frames are encoded
// into the buffer being filled (the open one); it closes when the next frame
// does not fit and waits, in order, for the transport, which takes the
// filled ones first and, when none is filled, the open one (so an idle
// connection sends at once, and frames batch only while the transport is
// busy). Buffers come back when their send completed.
//
// Guarded by the session's lock; the transport sees it through SessionSide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker {

class SendBuffers {
 public:
  static constexpr std::uint32_t kNone = ~0u;

  /// `count` buffers of `frame_size` bytes (the broker's largest frame).
  void init(std::uint32_t frame_size, std::uint32_t count);
  std::uint32_t frame_size() const { return frame_size_; }

  /// Makes the open buffer one with room for `len` more bytes: a full one
  /// closes, a free one opens. False when every buffer is taken.
  bool make_room(std::size_t len);
  /// Encodes a frame of `len` bytes (make_room(len) succeeded) into the open
  /// buffer, numbered with the next sequence unless `sequence` is not 0.
  void append(std::size_t len, const proto::FrameHeader& h, std::string_view subject, std::string_view reply,
              ByteView payload, std::uint64_t sequence, std::span<const proto::HeaderField> headers);

  std::pair<std::uint32_t, std::uint32_t> take_ready();
  bool has_ready() const { return !ready_.empty() || open_ != kNone; }
  bool has_free() const { return !free_.empty(); }
  void release(std::uint32_t buffer) {
    if (buffer != kNone) free_.push_back(buffer);
  }
  std::byte* buffer(std::uint32_t i) { return memory_.get() + std::size_t{i} * frame_size_; }
  std::span<std::byte> memory() { return {memory_.get(), std::size_t{count_} * frame_size_}; }

 private:
  std::unique_ptr<std::byte[]> memory_;
  std::uint32_t frame_size_ = 0;
  std::uint32_t count_ = 0;
  std::vector<std::uint32_t> free_;                            // buffer indices
  std::deque<std::pair<std::uint32_t, std::uint32_t>> ready_;  // (buffer, length) filled, not yet sent
  std::uint32_t open_ = kNone;                                 // being filled
  std::uint32_t open_len_ = 0;
  std::uint64_t next_sequence_ = 1;
};

}  // namespace rdmabroker
