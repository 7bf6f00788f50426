// SPDX-License-Identifier: Apache-2.0
// A worker's send blocks: small fixed-size pieces of memory that hold the
// headers and control frames of one send each (bodies are referenced in the
// pool). The RDMA link registers the whole region once per device; TCP
// writes from it directly. One owner: the worker's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "broker/outbound.hpp"

namespace rdmabroker::daemon {

class SendBlocks {
 public:
  static constexpr std::uint32_t kNone = ~0u;

  explicit SendBlocks(std::uint32_t count)
      : memory_(new std::byte[std::size_t{count} * kSendBlockSize]()), count_(count) {
    free_.reserve(count);
    for (std::uint32_t b = count; b-- > 0;) free_.push_back(b);
  }

  /// The whole region, for memory registration.
  std::span<std::byte> region() const { return {memory_.get(), std::size_t{count_} * kSendBlockSize}; }
  std::span<std::byte> block(std::uint32_t b) const {
    return {memory_.get() + std::size_t{b} * kSendBlockSize, kSendBlockSize};
  }
  /// A free block, or kNone: then the next give_back() says so, for the
  /// connections that found none to be flushed again.
  std::uint32_t peek() {
    if (free_.empty()) {
      starved_ = true;
      return kNone;
    }
    return free_.back();
  }
  /// Takes the block peek() returned.
  void take() { free_.pop_back(); }
  /// Returns `b`; true when a peek() found none since the last such answer.
  bool give_back(std::uint32_t b) {
    free_.push_back(b);
    return std::exchange(starved_, false);
  }

 private:
  std::unique_ptr<std::byte[]> memory_;
  std::uint32_t count_;
  std::vector<std::uint32_t> free_;
  bool starved_ = false;
};

}  // namespace rdmabroker::daemon
