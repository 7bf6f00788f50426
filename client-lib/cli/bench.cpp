#include "bench.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rdmabroker::cli {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// What every benchmark payload starts with.
struct Stamp {
  std::uint32_t publisher;
  std::uint32_t reserved;
  std::uint64_t seq;
  std::int64_t sent_ns;  // steady clock; the scheduled time at a fixed rate
};
static_assert(sizeof(Stamp) == 24);

std::int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

struct PublisherResult {
  std::uint64_t sent = 0;
  double seconds = 0;
  std::string error;
};

/// One subscriber's view, filled by its client's I/O thread.
struct SubscriberState {
  std::mutex mu;
  std::uint64_t received = 0;
  std::uint64_t reordered = 0;  // a sequence at or below one already seen from that publisher
  std::unordered_map<std::uint32_t, std::uint64_t> next_seq;  // per publisher
  std::vector<std::int64_t> latency_ns;
  std::int64_t first_ns = 0, last_ns = 0;
  std::atomic<std::uint64_t> count{0};
  std::string error;

  void on_message(const Message& m) {
    const std::int64_t t = now_ns();
    Stamp s{};
    if (m.payload.size() < sizeof s) return;
    std::memcpy(&s, m.payload.data(), sizeof s);
    std::lock_guard l(mu);
    auto [it, fresh] = next_seq.try_emplace(s.publisher, 0);
    if (!fresh && s.seq < it->second) ++reordered;
    it->second = std::max(it->second, s.seq + 1);
    latency_ns.push_back(t - s.sent_ns);
    if (first_ns == 0) first_ns = t;
    last_ns = t;
    ++received;
    count.fetch_add(1, std::memory_order_relaxed);
  }
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // microseconds
};

Percentiles percentiles(std::vector<std::int64_t> v) {
  Percentiles p;
  if (v.empty()) return p;
  auto at = [&](double q) {
    const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return static_cast<double>(v[k]) / 1000.0;
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = static_cast<double>(*std::max_element(v.begin(), v.end())) / 1000.0;
  return p;
}

nlohmann::json to_json(const Percentiles& p) {
  return {{"p50_us", p.p50}, {"p90_us", p.p90}, {"p99_us", p.p99}, {"p99_9_us", p.p999}, {"max_us", p.max}};
}

Result<std::unique_ptr<Client>> open(const BenchOptions& opt) {
  ClientOptions co;
  co.bind_address = opt.bind;
  co.publish_timeout = 30s;
  co.connect_timeout = 15s;
  return Client::connect(opt.url, co);
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  if (opt.size < sizeof(Stamp)) {
    std::cerr << "rdmabroker bench: --size must be at least " << sizeof(Stamp) << " bytes (the stamp)\n";
    return 2;
  }
  // Subscribers first, each on its own connection, active before anyone publishes.
  std::vector<std::unique_ptr<SubscriberState>> states;
  std::vector<std::unique_ptr<Client>> subs;
  for (std::uint32_t i = 0; i < opt.subscribers; ++i) {
    auto c = open(opt);
    if (!c) {
      std::cerr << "rdmabroker bench: subscriber " << i << ": " << c.error().message << "\n";
      return 1;
    }
    states.push_back(std::make_unique<SubscriberState>());
    SubscriberState* st = states.back().get();
    auto sid = c.value()->queue_subscribe(opt.subject, opt.queue, [st](const Message& m) { st->on_message(m); });
    if (!sid || !c.value()->flush(30s)) {
      std::cerr << "rdmabroker bench: subscribe failed\n";
      return 1;
    }
    subs.push_back(std::move(c.value()));
  }
  std::vector<std::unique_ptr<Client>> pubs;
  for (std::uint32_t i = 0; i < opt.publishers; ++i) {
    auto c = open(opt);
    if (!c) {
      std::cerr << "rdmabroker bench: publisher " << i << ": " << c.error().message << "\n";
      return 1;
    }
    pubs.push_back(std::move(c.value()));
  }
  if (!opt.json && opt.progress) {
    std::cerr << "bench: " << opt.publishers << " publisher(s) -> " << opt.subscribers << " subscriber(s)"
              << (opt.queue.empty() ? "" : " in queue group " + opt.queue) << ", " << opt.size << " B, "
              << (opt.duration_s > 0 ? std::to_string(opt.duration_s) + " s" : std::to_string(opt.count) + " msgs")
              << " each, " << (opt.rate > 0 ? std::to_string(opt.rate) + " msg/s each" : "flat out") << ", "
              << pubs.front()->transport_description() << "\n";
  }

  std::atomic<std::uint64_t> published{0};
  std::vector<PublisherResult> results(opt.publishers);
  std::vector<std::thread> threads;
  const auto start = Clock::now() + 50ms;  // everyone starts together
  for (std::uint32_t p = 0; p < opt.publishers; ++p) {
    threads.emplace_back([&, p] {
      std::vector<std::byte> payload(opt.size, std::byte{0x5a});
      Client& c = *pubs[p];
      std::this_thread::sleep_until(start);
      const auto t0 = Clock::now();
      const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.duration_s));
      const auto interval = opt.rate > 0 ? std::chrono::duration<double>(1.0 / opt.rate) : std::chrono::duration<double>(0);
      std::uint64_t seq = 0;
      for (;; ++seq) {
        if (opt.duration_s > 0 ? Clock::now() >= end : seq >= opt.count) break;
        Stamp s{p, 0, seq, 0};
        if (opt.rate > 0) {
          // The schedule, not the moment we got round to it: a publisher held
          // up by back-pressure still charges the delay to the messages.
          const auto due = t0 + std::chrono::duration_cast<Clock::duration>(interval * static_cast<double>(seq));
          std::this_thread::sleep_until(due);
          s.sent_ns = due.time_since_epoch().count();
        } else {
          s.sent_ns = now_ns();
        }
        std::memcpy(payload.data(), &s, sizeof s);
        if (auto st = c.publish(opt.subject, payload); !st) {
          results[p].error = st.error().message;
          break;
        }
        published.fetch_add(1, std::memory_order_relaxed);
      }
      if (auto st = c.flush(60s); !st && results[p].error.empty()) results[p].error = st.error().message;
      results[p].sent = seq;
      results[p].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  auto received_total = [&] {
    std::uint64_t n = 0;
    for (auto& s : states) n += s->count.load(std::memory_order_relaxed);
    return n;
  };
  // Progress once a second while publishing.
  std::atomic<bool> publishing{true};
  std::thread progress([&] {
    auto last = Clock::now();
    std::uint64_t last_pub = 0;
    int tick = 0;
    while (publishing.load()) {
      std::this_thread::sleep_for(100ms);
      if (Clock::now() - last < 1s) continue;
      const std::uint64_t p = published.load();
      if (!opt.json && opt.progress) {
        std::fprintf(stderr, "[%2ds] published %llu (%.0f msg/s), received %llu\n", ++tick,
                     static_cast<unsigned long long>(p),
                     static_cast<double>(p - last_pub) / std::chrono::duration<double>(Clock::now() - last).count(),
                     static_cast<unsigned long long>(received_total()));
      }
      last_pub = p;
      last = Clock::now();
    }
  });
  for (auto& t : threads) t.join();
  publishing = false;
  progress.join();

  // Wait for deliveries: all of them, or until nothing arrives for 5 s.
  std::uint64_t total_sent = 0;
  for (const auto& r : results) total_sent += r.sent;
  const std::uint64_t expected = opt.queue.empty() ? total_sent * opt.subscribers : total_sent;
  auto last_change = Clock::now();
  std::uint64_t seen = received_total();
  while (seen < expected && Clock::now() - last_change < 5s) {
    std::this_thread::sleep_for(10ms);
    if (const auto n = received_total(); n != seen) {
      seen = n;
      last_change = Clock::now();
    }
  }
  for (auto& c : subs) {
    if (!c->close_reason().message.empty() && states.front()->error.empty()) states.front()->error = c->close_reason().message;
    c->close();
  }
  for (auto& c : pubs) c->close();

  // Report.
  const double start_ns = static_cast<double>(start.time_since_epoch().count());
  nlohmann::json report;
  report["config"] = {{"url", opt.url},       {"subject", opt.subject}, {"queue", opt.queue},
                      {"publishers", opt.publishers}, {"subscribers", opt.subscribers}, {"size", opt.size},
                      {"count", opt.count},   {"duration_s", opt.duration_s}, {"rate", opt.rate}};
  nlohmann::json jp = nlohmann::json::array();
  double pub_seconds = 0;
  bool failed = false;
  for (std::uint32_t p = 0; p < opt.publishers; ++p) {
    const auto& r = results[p];
    pub_seconds = std::max(pub_seconds, r.seconds);
    jp.push_back({{"sent", r.sent}, {"seconds", r.seconds},
                  {"msgs_per_s", r.seconds > 0 ? static_cast<double>(r.sent) / r.seconds : 0},
                  {"mb_per_s", r.seconds > 0 ? static_cast<double>(r.sent) * opt.size / r.seconds / 1e6 : 0},
                  {"error", r.error}});
    failed |= !r.error.empty();
  }
  nlohmann::json js = nlohmann::json::array();
  std::vector<std::int64_t> all;
  std::uint64_t received = 0, reordered = 0;
  double last_ns = 0;
  for (auto& s : states) {
    std::lock_guard l(s->mu);
    const double secs = s->last_ns > 0 ? (static_cast<double>(s->last_ns) - start_ns) / 1e9 : 0;
    js.push_back({{"received", s->received}, {"reordered", s->reordered}, {"seconds", secs},
                  {"msgs_per_s", secs > 0 ? static_cast<double>(s->received) / secs : 0},
                  {"latency", to_json(percentiles(s->latency_ns))}, {"error", s->error}});
    received += s->received;
    reordered += s->reordered;
    last_ns = std::max(last_ns, static_cast<double>(s->last_ns));
    all.insert(all.end(), s->latency_ns.begin(), s->latency_ns.end());
    failed |= !s->error.empty();
  }
  const std::uint64_t lost = expected > received ? expected - received : 0;
  const double delivery_s = last_ns > 0 ? (last_ns - start_ns) / 1e9 : 0;
  const Percentiles lat = percentiles(all);
  report["publishers"] = jp;
  report["subscribers"] = js;
  report["aggregate"] = {{"published", total_sent},
                         {"publish_msgs_per_s", pub_seconds > 0 ? static_cast<double>(total_sent) / pub_seconds : 0},
                         {"expected", expected},
                         {"received", received},
                         {"lost", lost},
                         {"reordered", reordered},
                         {"delivery_msgs_per_s", delivery_s > 0 ? static_cast<double>(received) / delivery_s : 0},
                         {"delivery_mb_per_s", delivery_s > 0 ? static_cast<double>(received) * opt.size / delivery_s / 1e6 : 0},
                         {"latency", to_json(lat)}};
  if (opt.json) {
    std::cout << report.dump(2) << "\n";
  } else {
    const auto& a = report["aggregate"];
    for (std::size_t i = 0; i < jp.size(); ++i) {
      std::printf("publisher %zu: %llu msgs in %.2f s, %.0f msg/s, %.1f MB/s%s\n", i,
                  static_cast<unsigned long long>(jp[i]["sent"].get<std::uint64_t>()), jp[i]["seconds"].get<double>(),
                  jp[i]["msgs_per_s"].get<double>(), jp[i]["mb_per_s"].get<double>(),
                  jp[i]["error"].get<std::string>().empty() ? "" : (" ERROR " + jp[i]["error"].get<std::string>()).c_str());
    }
    for (std::size_t i = 0; i < js.size(); ++i) {
      const auto& l = js[i]["latency"];
      std::printf("subscriber %zu: %llu msgs, %.0f msg/s, %llu reordered, latency p50 %.1f us p99 %.1f us max %.1f us\n", i,
                  static_cast<unsigned long long>(js[i]["received"].get<std::uint64_t>()), js[i]["msgs_per_s"].get<double>(),
                  static_cast<unsigned long long>(js[i]["reordered"].get<std::uint64_t>()), l["p50_us"].get<double>(),
                  l["p99_us"].get<double>(), l["max_us"].get<double>());
    }
    std::printf("aggregate: published %llu (%.0f msg/s), received %llu of %llu (%.0f msg/s, %.1f MB/s), lost %llu, "
                "reordered %llu\n",
                static_cast<unsigned long long>(total_sent), a["publish_msgs_per_s"].get<double>(),
                static_cast<unsigned long long>(received), static_cast<unsigned long long>(expected),
                a["delivery_msgs_per_s"].get<double>(), a["delivery_mb_per_s"].get<double>(),
                static_cast<unsigned long long>(lost), static_cast<unsigned long long>(reordered));
    std::printf("latency: p50 %.1f us, p90 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us%s\n", lat.p50, lat.p90, lat.p99,
                lat.p999, lat.max, opt.rate > 0 ? " (from the schedule: coordinated omission corrected)" : "");
  }
  return failed || lost > 0 ? 1 : 0;
}

}  // namespace rdmabroker::cli
