// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks of the hot-path pieces (Google Benchmark): frame encode and
// decode (with and without message headers, and a client's header parsing), subject matching against 10,000
// subscriptions (trie alone and with a worker's match cache), buffer pool get/put, and the worker command
// queue; relay_stages.cpp: the broker's relay path by stage. Run by tests/bench/micro.sh; results in
// docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "broker/subscription_index.hpp"
#include "broker/buffer_pool.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "worker/command_queue.hpp"

namespace rdmabroker::daemon {
namespace {

void BM_EncodePublish(benchmark::State& state) {
  std::vector<std::byte> buf(16384);
  std::vector<std::byte> payload(static_cast<std::size_t>(state.range(0)), std::byte{1});
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  for (auto _ : state) {
    benchmark::DoNotOptimize(proto::encode_frame(buf, h, "orders.eu.created", {}, payload));
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_EncodePublish)->Arg(64)->Arg(1024)->Arg(8192);

void BM_DecodePublish(benchmark::State& state) {
  std::vector<std::byte> buf(16384);
  std::vector<std::byte> payload(static_cast<std::size_t>(state.range(0)), std::byte{1});
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  const auto n = proto::encode_frame(buf, h, "orders.eu.created", {}, payload);
  proto::Frame f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(proto::decode_frame(std::span<const std::byte>(buf.data(), n), 16384, f));
    benchmark::DoNotOptimize(f);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodePublish)->Arg(64)->Arg(1024)->Arg(8192);

// Message headers (SPEC.md §3.6): the two of tests/bench/headers.sh, a
// 64-byte block, on a 64-byte payload.
const proto::HeaderField kBenchHeaders[] = {{"Trace-Id", "4bf92f3577b34da6"},
                                            {"Content-Type", "application/json"}};

void BM_EncodePublishWithHeaders(benchmark::State& state) {
  std::vector<std::byte> buf(16384);
  std::vector<std::byte> payload(64, std::byte{1});
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  for (auto _ : state) {
    benchmark::DoNotOptimize(proto::encode_frame(buf, h, "orders.eu.created", {}, payload, kBenchHeaders));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EncodePublishWithHeaders);

/// Decoding checks the block (the broker once per PUBLISH, a client per message).
void BM_DecodePublishWithHeaders(benchmark::State& state) {
  std::vector<std::byte> buf(16384);
  std::vector<std::byte> payload(64, std::byte{1});
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  const auto n = proto::encode_frame(buf, h, "orders.eu.created", {}, payload, kBenchHeaders);
  proto::Frame f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(proto::decode_frame(std::span<const std::byte>(buf.data(), n), 16384, f));
    benchmark::DoNotOptimize(f);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodePublishWithHeaders);

/// What a client adds per delivered message: the block's fields into the
/// (recycled) Message's rdmabroker::Headers.
void BM_HeadersIntoMessage(benchmark::State& state) {
  std::vector<std::byte> block(proto::header_block_len(kBenchHeaders));
  proto::encode_header_block(block.data(), kBenchHeaders);
  rdmabroker::Headers headers;
  for (auto _ : state) {
    headers.clear();
    proto::for_each_header(block, [&](std::string_view n, std::string_view v) { headers.add(n, v); });
    benchmark::DoNotOptimize(headers);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HeadersIntoMessage);

/// 10,000 subscriptions over a realistic vocabulary: mostly literal, some
/// with '*' and '>', a tenth in queue groups; subjects drawn from the same
/// vocabulary (so some match many patterns, most a few).
struct Fixture {
  SubscriptionIndex index;
  std::vector<std::string> subjects;
  Fixture() {
    std::mt19937 rng(42);
    auto tok = [&](int n) { return "t" + std::to_string(rng() % static_cast<unsigned>(n)); };
    for (std::uint32_t i = 0; i < 10'000; ++i) {
      std::string p = tok(10) + "." + tok(30);
      const auto r = rng() % 10;
      p += r == 0 ? ".*" : r == 1 ? ".>" : "." + tok(50);
      index.add(p, Subscriber{0, i, 1, 0}, i % 10 == 0 ? "g" + std::to_string(i % 3) : "");
    }
    for (int i = 0; i < 1000; ++i) subjects.push_back(tok(10) + "." + tok(30) + "." + tok(50));
  }
};

void BM_MatchTrie(benchmark::State& state) {
  static Fixture fx;
  std::vector<Subscriber> out;
  std::size_t i = 0;
  for (auto _ : state) {
    fx.index.match(fx.subjects[i++ % fx.subjects.size()], out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MatchTrie);

void BM_MatchCached(benchmark::State& state) {
  static Fixture fx;
  MatchCache cache;
  std::size_t i = 0;
  for (auto _ : state) {
    Match& m = cache.match(fx.index, fx.subjects[i++ % fx.subjects.size()]);
    benchmark::DoNotOptimize(&m);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_ratio"] =
      static_cast<double>(cache.hits()) / static_cast<double>(cache.hits() + cache.misses());
}
BENCHMARK(BM_MatchCached);

void BM_PoolGetPut(benchmark::State& state) {
  auto pool = BufferPool::create(1024, 4096);
  std::vector<std::uint32_t> idx(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    const auto got = pool.value()->acquire(idx.data(), idx.size());
    for (std::size_t k = 0; k < got; ++k) pool.value()->release(idx[k]);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_PoolGetPut)->Arg(1)->Arg(32);

/// One producer thread posting, the owner draining: items per second through
/// the worker command queue (what cross-worker deliveries pay).
void BM_CommandQueue(benchmark::State& state) {
  CommandQueue<std::uint64_t> q;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> consumed{0};
  std::thread producer([&] {
    std::int64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      // Bounded backlog: measure the hand-over, not a growing queue.
      if (n - consumed.load(std::memory_order_relaxed) > 65536) continue;
      q.post(static_cast<std::uint64_t>(n++));
    }
  });
  std::vector<std::uint64_t> batch;
  std::int64_t items = 0;
  for (auto _ : state) {
    q.drain(batch);
    items += static_cast<std::int64_t>(batch.size());
    consumed.store(items, std::memory_order_relaxed);
    batch.clear();
  }
  stop = true;
  producer.join();
  state.SetItemsProcessed(items);
}
BENCHMARK(BM_CommandQueue)->UseRealTime()->MinTime(0.5);

}  // namespace
}  // namespace rdmabroker::daemon

BENCHMARK_MAIN();
