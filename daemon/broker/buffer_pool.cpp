// SPDX-License-Identifier: Apache-2.0
#include "broker/buffer_pool.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fault/fault.hpp"

namespace rdmabroker::daemon {

Result<std::unique_ptr<BufferPool>> BufferPool::create(std::uint32_t count, std::uint32_t buffer_size) {
  if (count == 0 || buffer_size == 0 || buffer_size % 64 != 0) {
    return Error{ErrorKind::kInvalidArgument,
                 "buffer pool: count must be > 0 and buffer size a multiple of 64"};
  }
  const std::size_t bytes = std::size_t{count} * buffer_size;
  // mmap gives page alignment and lazily committed zero pages.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Error{ErrorKind::kResource,
                 "buffer pool: mmap of " + std::to_string(bytes) + " bytes failed: " + std::strerror(errno)};
  }
  return std::unique_ptr<BufferPool>(new BufferPool(static_cast<std::byte*>(p), count, buffer_size));
}

BufferPool::BufferPool(std::byte* base, std::uint32_t count, std::uint32_t buffer_size)
    : base_(base), count_(count), buffer_size_(buffer_size), refs_(new std::atomic<std::uint32_t>[count]) {
  free_.reserve(count);
  // Hand out low indices first so a lightly loaded broker touches few pages.
  for (std::uint32_t i = count; i-- > 0;) {
    refs_[i].store(0, std::memory_order_relaxed);
    free_.push_back(i);
  }
}

BufferPool::~BufferPool() { ::munmap(base_, std::size_t{count_} * buffer_size_); }

std::size_t BufferPool::acquire(std::uint32_t* out, std::size_t n, std::uint32_t keep_free) {
  std::size_t got = 0;
  if constexpr (fault::kEnabled) {
    if (exhausted_.load(std::memory_order_relaxed)) return 0;
  }
  {
    std::lock_guard lock(free_mutex_);
    while (got < n && free_.size() > keep_free) {
      out[got++] = free_.back();
      free_.pop_back();
    }
  }
  for (std::size_t i = 0; i < got; ++i) refs_[out[i]].store(1, std::memory_order_relaxed);
  in_use_.fetch_add(static_cast<std::uint32_t>(got), std::memory_order_relaxed);
  return got;
}

void BufferPool::release(std::uint32_t index) {
  // acq_rel: the thread that frees must see every other holder's last access.
  if (refs_[index].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  in_use_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard lock(free_mutex_);
  free_.push_back(index);
}

}  // namespace rdmabroker::daemon
