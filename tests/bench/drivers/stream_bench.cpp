// SPDX-License-Identifier: Apache-2.0
// stream_bench: durable messaging measured the same way on rdmabroker
// (librdmabroker: publish_acked_async, publish_acked, a consumer) and on
// NATS JetStream (libnats: js_PublishAsync, js_Publish, a push consumer),
// for tests/bench/streams.sh. One measurement per run, one JSON line out:
//   publish  COUNT messages of SIZE bytes with acknowledgements, at most
//            WINDOW unanswered: msgs_per_s from the first publish to the
//            last acknowledgement;
//   latency  COUNT acknowledged publishes one after the other: p50/p99 of
//            each from the call to its acknowledgement;
//   replay   COUNT messages stored first (not timed), then read by a new
//            consumer without acknowledgements: msgs_per_s from opening it
//            to the last message.
// The stream (rdmabroker: declared in the broker's configuration; JetStream:
// created here, file storage) takes `bench.>` and is purged before each run.
#include <nats/nats.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "rdmabroker/client.hpp"
#include "rdmabroker/consumer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string system = "rdmabroker", url, what = "publish", stream = "BENCH", bind;
  std::size_t size = 64, count = 100000, window = 256;
};

struct Outcome {
  double msgs_per_s = 0, p50_us = 0, p99_us = 0;
  std::string error;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double rate(std::size_t n, Clock::time_point from) {
  return static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - from).count();
}

/// At most `window` unanswered: a counter the acknowledgements give back.
/// A publisher that found it full sleeps until half of it is free again: a
/// wake-up per half window, not per acknowledgement (on an emulated
/// machine a thread's wake-up costs more than a message).
class Window {
 public:
  explicit Window(std::size_t n) : size_(n), free_(n) {}
  void take() {
    std::unique_lock lock(mu_);
    if (free_ == 0) cv_.wait(lock, [&] { return free_ >= std::max<std::size_t>(1, size_ / 2); });
    --free_;
  }
  void give(bool ok) {
    std::lock_guard lock(mu_);
    ++free_;
    ++done_;
    failed_ += ok ? 0 : 1;
    if (free_ == std::max<std::size_t>(1, size_ / 2) || done_ >= waited_for_) cv_.notify_all();
  }
  void wait_done(std::size_t n) {
    std::unique_lock lock(mu_);
    waited_for_ = n;
    cv_.wait(lock, [&] { return done_ >= n; });
  }
  std::size_t failed() const { return failed_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const std::size_t size_;
  std::size_t free_, done_ = 0, failed_ = 0, waited_for_ = ~std::size_t{0};
};

// ------------------------------------------------------------------ rdmabroker

Outcome run_rdmabroker(const Args& a) {
  using namespace rdmabroker;
  ClientOptions opt;
  opt.bind_address = a.bind;
  auto c = Client::connect(a.url, opt);
  if (!c) return {0, 0, 0, c.error().message};
  Client& client = *c.value();
  const std::string payload(a.size, 'x');
  const auto fill = [&](std::size_t n) {
    Window w(a.window);
    for (std::size_t i = 0; i < n; ++i) {
      w.take();
      if (!client.publish_acked_async("bench.s", {}, as_payload(payload),
                                      [&](Result<PubAck> r) { w.give(r.ok()); }))
        w.give(false);
    }
    w.wait_done(n);
    return w.failed();
  };
  Outcome out;
  if (a.what == "publish") {
    const auto t0 = Clock::now();
    if (fill(a.count) != 0) out.error = "acknowledged publishes failed";
    out.msgs_per_s = rate(a.count, t0);
  } else if (a.what == "latency") {
    std::vector<double> us;
    for (std::size_t i = 0; i < a.count; ++i) {
      const auto t0 = Clock::now();
      if (!client.publish_acked("bench.s", payload, std::chrono::seconds(10)))
        return {0, 0, 0, "publish failed"};
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    out.p50_us = percentile(us, 0.5);
    out.p99_us = percentile(us, 0.99);
  } else {
    if (fill(a.count) != 0) return {0, 0, 0, "filling the stream failed"};
    const auto t0 = Clock::now();
    auto all = client.consume(a.stream, {.ack = ConsumerOptions::Ack::kNone, .max_ack_pending = 65536},
                              std::chrono::seconds(10));
    if (!all) return {0, 0, 0, all.error().message};
    std::size_t got = 0;
    while (got < a.count) {
      auto m = all.value()->next(std::chrono::seconds(10));
      if (!m) return {0, 0, 0, "replay stopped after " + std::to_string(got) + ": " + m.error().message};
      ++got;
    }
    out.msgs_per_s = rate(a.count, t0);
  }
  client.close();
  return out;
}

// ------------------------------------------------------------------ JetStream

std::string nats_error(natsStatus s) {
  natsStatus ignored;
  const char* last = nats_GetLastError(&ignored);
  return std::string(natsStatus_GetText(s)) + (last != nullptr && *last ? std::string(": ") + last : "");
}

struct Replay {
  std::atomic<std::size_t> got{0};
};

void on_replayed(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
  static_cast<Replay*>(closure)->got.fetch_add(1, std::memory_order_relaxed);
  natsMsg_Destroy(m);
}

Outcome run_jetstream(const Args& a) {
  natsConnection* nc = nullptr;
  natsStatus s = natsConnection_ConnectTo(&nc, a.url.c_str());
  if (s != NATS_OK) return {0, 0, 0, nats_error(s)};
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.PublishAsync.MaxPending = static_cast<int64_t>(a.window);
  jsCtx* js = nullptr;
  s = natsConnection_JetStream(&js, nc, &jo);
  jsErrCode jerr = static_cast<jsErrCode>(0);
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = a.stream.c_str();
  const char* subjects[] = {"bench.>"};
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  if (s == NATS_OK) {
    s = js_AddStream(&si, js, &cfg, nullptr, &jerr);
    if (s == NATS_OK) jsStreamInfo_Destroy(si);
  }
  if (s == NATS_OK) s = js_PurgeStream(js, a.stream.c_str(), nullptr, &jerr);
  Outcome out;
  const std::string payload(a.size, 'x');
  const auto fill = [&](std::size_t n) {
    natsStatus st = NATS_OK;
    for (std::size_t i = 0; i < n && st == NATS_OK; ++i)
      st = js_PublishAsync(js, "bench.s", payload.data(), static_cast<int>(payload.size()), nullptr);
    if (st == NATS_OK) {
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = 60000;
      st = js_PublishAsyncComplete(js, &po);
    }
    return st;
  };
  if (s != NATS_OK) {
    out.error = nats_error(s);
  } else if (a.what == "publish") {
    const auto t0 = Clock::now();
    if (natsStatus st = fill(a.count); st != NATS_OK) out.error = nats_error(st);
    out.msgs_per_s = rate(a.count, t0);
  } else if (a.what == "latency") {
    std::vector<double> us;
    for (std::size_t i = 0; i < a.count && out.error.empty(); ++i) {
      const auto t0 = Clock::now();
      jsPubAck* ack = nullptr;
      natsStatus st =
          js_Publish(&ack, js, "bench.s", payload.data(), static_cast<int>(payload.size()), nullptr, &jerr);
      if (st != NATS_OK) out.error = nats_error(st);
      jsPubAck_Destroy(ack);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    out.p50_us = percentile(us, 0.5);
    out.p99_us = percentile(us, 0.99);
  } else if (natsStatus st = fill(a.count); st != NATS_OK) {
    out.error = nats_error(st);
  } else {
    Replay r;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Config.AckPolicy = js_AckNone;
    so.Config.DeliverPolicy = js_DeliverAll;
    natsSubscription* sub = nullptr;
    const auto t0 = Clock::now();
    st = js_Subscribe(&sub, js, "bench.>", on_replayed, &r, nullptr, &so, &jerr);
    if (st == NATS_OK) st = natsSubscription_SetPendingLimits(sub, -1, -1);
    const auto deadline = Clock::now() + std::chrono::minutes(5);
    while (st == NATS_OK && r.got.load() < a.count && Clock::now() < deadline) nats_Sleep(1);
    out.msgs_per_s = rate(a.count, t0);
    if (st != NATS_OK) out.error = nats_error(st);
    if (r.got.load() < a.count) out.error = "replay got " + std::to_string(r.got.load());
    natsSubscription_Destroy(sub);
  }
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"stream_bench: durable publish, acknowledgement latency and replay (tests/bench/streams.sh)"};
  app.add_option("--system", a.system)->check(CLI::IsMember({"rdmabroker", "jetstream"}));
  app.add_option("-s,--server", a.url)->required();
  app.add_option("--what", a.what)->check(CLI::IsMember({"publish", "latency", "replay"}));
  app.add_option("--size", a.size);
  app.add_option("-n,--count", a.count);
  app.add_option("--window", a.window);
  app.add_option("--stream", a.stream);
  app.add_option("-b,--bind", a.bind, "rdmabroker over RDMA: the local address (device)");
  CLI11_PARSE(app, argc, argv);
  const Outcome o = a.system == "rdmabroker" ? run_rdmabroker(a) : run_jetstream(a);
  if (!o.error.empty()) {
    std::cerr << "stream_bench: " << a.system << " " << a.what << ": " << o.error << "\n";
    return 1;
  }
  std::printf(
      "{\"system\":\"%s\",\"what\":\"%s\",\"size\":%zu,\"count\":%zu,\"window\":%zu,"
      "\"msgs_per_s\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
      a.system.c_str(), a.what.c_str(), a.size, a.count, a.window, o.msgs_per_s, o.p50_us, o.p99_us);
  return 0;
}
