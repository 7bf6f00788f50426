// SPDX-License-Identifier: Apache-2.0
// The broker's own share of a relay, stage by stage, on the host and without
// a device (issue 47): one worker's frame handler, router and queues, with
// links that pack each send as the RDMA link does (Connections::pack_next,
// record_send: header into a send block, body as SGEs on the pool buffer)
// and complete it at once. One 64-byte PUBLISH from a publisher to
// subscribers on the same worker:
//   BM_RelayHandle     the frame handler: decode, permission, match, queue
//   BM_RelayWhole      the same and the end of the loop turn: pack, post,
//                      retire (what a DELIVER's relay time measures, less the
//                      device's post)
//   BM_RelayFanout/N   BM_RelayWhole to N subscribers
//   BM_RelayBatch/N    N PUBLISHes in one receive, one loop turn: flat out
// The device's own cost (ibv_post_send, completions) is not here: it is
// tests/bench/latency-budget.sh's, measured in the guest.
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "worker_data_path.hpp"

namespace rdmabroker::daemon {
namespace {

/// Packs and completes every send at once: the link's share of a flush
/// without a device.
class CompletingLink final : public Link {
 public:
  explicit CompletingLink(Connections& connections) : connections_(connections) {}

  Transport transport() const override { return Transport::kRdma; }
  void flush() override {
    Connection& c = connection();
    while (c.can_send() && !c.outq.empty()) {
      std::array<Segment, kMaxSendSge> sge;
      std::array<BufferRef, kMaxFramesPerSend> refs;
      PackedSend packed;
      const std::uint32_t block = connections_.pack_next(c, kMaxSendSge, 1, 2, sge.data(), refs, packed);
      if (block == SendBlocks::kNone) return;
      benchmark::DoNotOptimize(sge.data());
      connections_.record_send(c, block, &refs, packed);
      connections_.retire_send(c, true);
    }
  }
  void pause() override {}
  void resume() override {}
  bool input_paused() const override { return false; }
  void add_send_credits(std::uint32_t) override {}
  void disconnect() override {}
  void release() override {}
  std::string where() const override { return "in a micro-benchmark"; }

 private:
  Connections& connections_;
};

/// One worker's data path (tests/worker_data_path.hpp) around CompletingLinks.
class Relay {
 public:
  Relay()
      : path_(DataPathShape{.buffer_size = 16384,
                            .max_connections = 256,
                            .pool_buffers = 1024,
                            .send_blocks = 256,
                            .workers = 1}) {}

  Connection& connect() {
    Connection& c =
        path_.accept(std::make_unique<CompletingLink>(*path_.connections), proto::kProtocolVersion, 64);
    receive(c, frame(proto::FrameType::kConnect, "", 0, 1));
    return c;
  }
  void subscribe(Connection& c, std::string_view subject, std::uint32_t sid) {
    receive(c, frame(proto::FrameType::kSubscribe, subject, 0, 1, sid));
  }
  /// `count` frames of `type` in one buffer, as one receive would bring them.
  static std::vector<std::byte> frame(proto::FrameType type, std::string_view subject, std::size_t payload,
                                      std::size_t count, std::uint32_t arg = 0) {
    const std::string body(payload, 'p');
    proto::FrameHeader h;
    h.type = type;
    h.arg = arg;
    const std::size_t one = proto::align_up(proto::kHeaderSize + subject.size() + payload);
    // Room past the frames: GCC's bounds check takes an empty subject
    // copied to the end of an exactly sized vector for an overflow.
    std::vector<std::byte> out(one * count + proto::kHeaderSize);
    for (std::size_t i = 0; i < count; ++i)
      proto::encode_frame(std::span(out).subspan(i * one, one), h, subject, "",
                          std::as_bytes(std::span(body)));
    out.resize(one * count);
    return out;
  }
  BufferRef buffer(const std::vector<std::byte>& bytes) { return path_.receive_buffer(bytes); }
  /// The frame handler's work on one receive, without the end of the turn.
  void handle(Connection& c, const BufferRef& buf, std::size_t len) {
    path_.frames->process(c, buf, 0, static_cast<std::uint32_t>(len));
  }
  void end_turn() { path_.end_turn(); }
  void receive(Connection& c, const std::vector<std::byte>& bytes) { path_.receive(c, bytes); }
  std::uint64_t deliveries() const { return path_.ctx->stats.deliveries.get(); }

 private:
  WorkerDataPath path_;
};

constexpr std::size_t kPayload = 64;

/// Publishes `per_receive` messages per receive to `subscribers`; the loop
/// turn ends after each receive when `whole`, else every 256 receives with
/// the timer stopped (the handler's share alone).
void relay(benchmark::State& state, int subscribers, std::size_t per_receive, bool whole) {
  spdlog::set_level(spdlog::level::warn);  // a connection's log line on stdout would break the JSON output
  Relay r;
  Connection& publisher = r.connect();
  for (int i = 0; i < subscribers; ++i)
    r.subscribe(r.connect(), "bench.relay", static_cast<std::uint32_t>(i + 1));
  const auto bytes = Relay::frame(proto::FrameType::kPublish, "bench.relay", kPayload, per_receive);
  BufferRef buf = r.buffer(bytes);
  const std::uint64_t before = r.deliveries();
  std::int64_t turns = 0;
  for (auto _ : state) {
    r.handle(publisher, buf, bytes.size());
    if (whole) {
      r.end_turn();
    } else if (++turns % 256 == 0) {
      state.PauseTiming();
      r.end_turn();
      state.ResumeTiming();
    }
  }
  r.end_turn();
  const auto messages = state.iterations() * static_cast<std::int64_t>(per_receive);
  if (r.deliveries() - before != static_cast<std::uint64_t>(messages * subscribers))
    state.SkipWithError("a message was not delivered");
  state.SetItemsProcessed(messages);
}

void BM_RelayHandle(benchmark::State& state) { relay(state, 1, 1, false); }
BENCHMARK(BM_RelayHandle);
void BM_RelayWhole(benchmark::State& state) { relay(state, 1, 1, true); }
BENCHMARK(BM_RelayWhole);
void BM_RelayFanout(benchmark::State& state) { relay(state, static_cast<int>(state.range(0)), 1, true); }
BENCHMARK(BM_RelayFanout)->Arg(8)->Arg(64);
void BM_RelayBatch(benchmark::State& state) {
  relay(state, 1, static_cast<std::size_t>(state.range(0)), true);
}
BENCHMARK(BM_RelayBatch)->Arg(16);

}  // namespace
}  // namespace rdmabroker::daemon
