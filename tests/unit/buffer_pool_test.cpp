// SPDX-License-Identifier: Apache-2.0
// The shared buffer pool: exhaustion, reference counting of fanned-out
// buffers, and release from many threads at once (run under TSan in CI).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "broker/buffer_pool.hpp"

namespace rdmabroker::daemon {
namespace {

TEST(BufferPool, RejectsBadGeometry) {
  EXPECT_FALSE(BufferPool::create(0, 1024).ok());
  EXPECT_FALSE(BufferPool::create(4, 1000).ok());
}

TEST(BufferPool, AcquireUntilEmptyThenReleaseMakesRoom) {
  auto pool = std::move(BufferPool::create(4, 1024).value());
  std::uint32_t idx[8];
  EXPECT_EQ(pool->acquire(idx, 8), 4u);
  EXPECT_EQ(pool->in_use(), 4u);
  std::uint32_t more;
  EXPECT_EQ(pool->acquire(&more, 1), 0u);
  pool->release(idx[2]);
  EXPECT_EQ(pool->acquire(&more, 1), 1u);
  EXPECT_EQ(more, idx[2]);
  // Buffers do not overlap.
  EXPECT_EQ(pool->data(1) - pool->data(0), 1024);
}

TEST(BufferPool, LastReferenceReturnsTheBuffer) {
  auto pool = std::move(BufferPool::create(2, 1024).value());
  std::uint32_t i;
  ASSERT_EQ(pool->acquire(&i, 1), 1u);
  BufferRef a(pool.get(), i);
  BufferRef b = a.clone();
  BufferRef c = b.clone();
  a.reset();
  b.reset();
  EXPECT_EQ(pool->in_use(), 1u);  // c still holds it
  BufferRef moved = std::move(c);
  EXPECT_FALSE(c);
  EXPECT_EQ(pool->in_use(), 1u);
  moved.reset();
  EXPECT_EQ(pool->in_use(), 0u);
}

TEST(BufferPool, ConcurrentReleaseFromManyThreads) {
  auto pool = std::move(BufferPool::create(64, 1024).value());
  for (int round = 0; round < 50; ++round) {
    std::vector<std::uint32_t> idx(64);
    ASSERT_EQ(pool->acquire(idx.data(), 64), 64u);
    std::vector<BufferRef> refs[4];
    for (auto i : idx) {
      BufferRef r(pool.get(), i);
      for (int t = 1; t < 4; ++t) refs[t].push_back(r.clone());
      refs[0].push_back(std::move(r));
    }
    std::vector<std::thread> threads;
    for (auto& v : refs) threads.emplace_back([&v] { v.clear(); });
    for (auto& t : threads) t.join();
    ASSERT_EQ(pool->in_use(), 0u);
  }
}

}  // namespace
}  // namespace rdmabroker::daemon
