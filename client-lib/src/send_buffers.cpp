// SPDX-License-Identifier: Apache-2.0
#include "send_buffers.hpp"

namespace rdmabroker {

void SendBuffers::init(std::uint32_t frame_size, std::uint32_t count) {
  frame_size_ = frame_size;
  count_ = count;
  memory_.reset(new std::byte[std::size_t{count} * frame_size]);
  free_.clear();
  for (std::uint32_t i = count; i-- > 0;) free_.push_back(i);
  ready_.clear();
  open_ = kNone;
}

bool SendBuffers::make_room(std::size_t len) {
  if (open_ != kNone && open_len_ + len > frame_size_) {
    ready_.emplace_back(open_, open_len_);
    open_ = kNone;
  }
  if (open_ == kNone && !free_.empty()) {
    open_ = free_.back();
    free_.pop_back();
    open_len_ = 0;
  }
  return open_ != kNone;
}

void SendBuffers::append(std::size_t len, const proto::FrameHeader& h, std::string_view subject,
                         std::string_view reply, ByteView payload, std::uint64_t sequence,
                         std::span<const proto::HeaderField> headers) {
  proto::FrameHeader hdr = h;
  hdr.sequence = next_sequence_++;
  if (sequence != 0) hdr.sequence = sequence;
  proto::encode_frame(std::span<std::byte>(buffer(open_) + open_len_, len), hdr, subject, reply, payload,
                      headers);
  open_len_ += static_cast<std::uint32_t>(len);
}

std::pair<std::uint32_t, std::uint32_t> SendBuffers::take_ready() {
  if (!ready_.empty()) {
    auto r = ready_.front();
    ready_.pop_front();
    return r;
  }
  if (open_ != kNone) return {std::exchange(open_, kNone), open_len_};
  return {kNone, 0};
}

}  // namespace rdmabroker
