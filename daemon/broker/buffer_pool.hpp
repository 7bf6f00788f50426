// SPDX-License-Identifier: Apache-2.0
// The broker's one pool of fixed-size message buffers. Every receive on every
// SRQ is posted from it, it is registered once per device (MR per PD), and a
// received buffer is shared zero-copy by every send that fans it out: each
// holds a BufferRef, and the last one to let go returns the buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

class BufferPool {
 public:
  /// Allocates `count` buffers of `buffer_size` bytes (page aligned, zeroed).
  static Result<std::unique_ptr<BufferPool>> create(std::uint32_t count, std::uint32_t buffer_size);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  std::uint32_t buffer_size() const { return buffer_size_; }
  std::uint32_t count() const { return count_; }
  std::byte* data(std::uint32_t index) const { return base_ + std::size_t{index} * buffer_size_; }
  /// The whole region, for memory registration.
  std::span<std::byte> region() const { return {base_, std::size_t{count_} * buffer_size_}; }

  /// Takes up to `n` free buffers (reference count 1 each), leaving at least
  /// `keep_free` on the free list (the reserve that only receive-queue
  /// refills may take: broker/pool_shares.hpp); returns how many.
  std::size_t acquire(std::uint32_t* out, std::size_t n, std::uint32_t keep_free = 0);
  void add_ref(std::uint32_t index) { refs_[index].fetch_add(1, std::memory_order_relaxed); }
  /// Whether more than one reference holds buffer `index` now (a hint: another
  /// thread may let go of its reference at any moment).
  bool shared(std::uint32_t index) const { return refs_[index].load(std::memory_order_relaxed) > 1; }
  /// Drops one reference; the last one puts the buffer back on the free list.
  void release(std::uint32_t index);

  std::uint32_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  /// Test builds (fault pool-exhaust): while set, acquire() hands out nothing,
  /// as if every buffer were in use.
  void set_exhausted(bool on) { exhausted_.store(on, std::memory_order_relaxed); }
  /// True when acquire() would hand out nothing.
  bool exhausted() const { return in_use() >= count_ || exhausted_.load(std::memory_order_relaxed); }
  /// True when acquire(..., keep_free) would hand out something.
  bool has_free_above(std::uint32_t keep_free) const { return !exhausted() && count_ - in_use() > keep_free; }

 private:
  BufferPool(std::byte* base, std::uint32_t count, std::uint32_t buffer_size);

  std::byte* base_;
  std::uint32_t count_;
  std::uint32_t buffer_size_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> refs_;
  std::mutex free_mutex_;
  std::vector<std::uint32_t> free_;  // guarded by free_mutex_
  std::atomic<std::uint32_t> in_use_{0};
  std::atomic<bool> exhausted_{false};
};

/// One reference to a pool buffer. Move-only; clone() takes another reference.
class BufferRef {
 public:
  BufferRef() = default;
  /// Adopts a reference the caller already holds (e.g. from acquire()).
  BufferRef(BufferPool* pool, std::uint32_t index) : pool_(pool), index_(index) {}
  BufferRef(BufferRef&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), index_(o.index_) {}
  BufferRef& operator=(BufferRef&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      index_ = o.index_;
    }
    return *this;
  }
  BufferRef(const BufferRef&) = delete;
  BufferRef& operator=(const BufferRef&) = delete;
  ~BufferRef() { reset(); }

  BufferRef clone() const {
    pool_->add_ref(index_);
    return BufferRef(pool_, index_);
  }
  void reset() {
    if (pool_ != nullptr) std::exchange(pool_, nullptr)->release(index_);
  }
  explicit operator bool() const { return pool_ != nullptr; }
  std::uint32_t index() const { return index_; }
  std::byte* data() const { return pool_->data(index_); }

 private:
  BufferPool* pool_ = nullptr;
  std::uint32_t index_ = 0;
};

}  // namespace rdmabroker::daemon
