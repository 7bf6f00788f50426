// SPDX-License-Identifier: Apache-2.0
#include "bench.hpp"
#include "latency_histogram.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <sys/prctl.h>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rdmabroker::bench {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// What every benchmark payload starts with.
struct Stamp {
  std::uint32_t publisher;
  std::uint32_t lag_us;  // at a fixed rate: how late the publisher got round to it (saturating)
  std::uint64_t seq;
  std::int64_t sent_ns;  // steady clock; the scheduled time at a fixed rate
};
static_assert(sizeof(Stamp) == 24);

std::int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

struct PublisherResult {
  std::uint64_t sent = 0;
  double seconds = 0;
  std::string error;
  /// --trace: each message's times (steady ns), by sequence.
  struct Call {
    std::int64_t due, call, returned;  // due: the schedule at a fixed rate, else the call
  };
  std::vector<Call> calls;
};

/// --trace: what a subscriber saw of one message.
struct Arrival {
  std::uint32_t publisher;
  std::uint64_t seq;
  std::int64_t received_ns;  // its client took it from the transport (0: unknown)
  std::int64_t relay_ns;     // in the broker (0: unknown)
  std::int64_t handler_ns;   // the handler had it
};

/// One subscriber's view, filled by its client's delivery thread.
struct SubscriberState {
  std::mutex mu;
  std::uint64_t received = 0;
  std::uint64_t reordered = 0;  // a sequence at or below one already seen from that publisher
  std::uint64_t malformed = 0;  // shorter than the stamp
  std::unordered_map<std::uint32_t, std::uint64_t> next_seq;  // per publisher
  LatencyHistogram latency;            // from the schedule (coordinated omission corrected)
  LatencyHistogram latency_from_send;  // from the moment of the publish call
  std::int64_t first_ns = 0, last_ns = 0;
  std::atomic<std::uint64_t> count{0};
  std::string error;
  bool trace = false;
  std::vector<Arrival> arrivals;  // --trace

  void on_payload(const Received& r) {
    const std::int64_t t = now_ns();
    std::lock_guard l(mu);
    Stamp s{};
    if (r.payload.size() < sizeof s) {
      ++malformed;
      return;
    }
    std::memcpy(&s, r.payload.data(), sizeof s);
    if (trace) arrivals.push_back({s.publisher, s.seq, r.received_ns, r.relay_ns, t});
    auto [it, fresh] = next_seq.try_emplace(s.publisher, 0);
    if (!fresh && s.seq < it->second) ++reordered;
    it->second = std::max(it->second, s.seq + 1);
    latency.record(t - s.sent_ns);
    latency_from_send.record(t - s.sent_ns - std::int64_t{s.lag_us} * 1000);
    if (first_ns == 0) first_ns = t;
    last_ns = t;
    ++received;
    count.fetch_add(1, std::memory_order_relaxed);
  }
};

nlohmann::json to_json(const LatencyHistogram& h) {
  return {{"p50_us", h.quantile_us(0.5)},
          {"p90_us", h.quantile_us(0.9)},
          {"p99_us", h.quantile_us(0.99)},
          {"p99_9_us", h.quantile_us(0.999)},
          {"max_us", h.max_us()}};
}

double per_second(double n, double seconds) { return seconds > 0 ? n / seconds : 0; }

/// A number as a person writes it: 4, 0.5, 2.25 (not 4.000000).
std::string fmt_number(double n) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", n);
  return text;
}

/// --trace: the latency budget. A message's path, by the times its publisher
/// and its subscriber's client took and the relay time the broker put in its
/// DELIVER (SPEC.md §3.4): schedule -> publish call -> publish returns ->
/// [hop to the broker, the broker, hop to the subscriber] -> the client
/// takes it from the transport -> the handler has it. The hops are what is
/// left of the bracket once the broker's own time is taken out: devices,
/// wire and every wake-up on the way (the broker worker's, the
/// subscriber's I/O thread's).
struct Budget {
  struct Stage {
    const char* key;
    const char* label;
    LatencyHistogram h;
  };
  std::array<Stage, 7> stages{{{"schedule_to_call", "schedule -> publish call", {}},
                               {"publish_call", "publish call -> return", {}},
                               {"return_to_client", "return -> subscriber's client", {}},
                               {"broker", "  of it in the broker (relay time)", {}},
                               {"hops", "  of it both hops: devices, wire, wake-ups", {}},
                               {"client_to_handler", "client -> handler", {}},
                               {"total", "publish call -> handler", {}}}};
  std::uint64_t traced = 0;         // messages matched to their publish
  std::uint64_t without_relay = 0;  // the broker said nothing (version < 5, multicast)

  void add(const PublisherResult::Call& c, const Arrival& a) {
    ++traced;
    stages[0].h.record(c.call - c.due);
    stages[1].h.record(c.returned - c.call);
    stages[6].h.record(a.handler_ns - c.call);
    if (a.received_ns == 0) return;  // a client that does not say when it took it
    stages[2].h.record(a.received_ns - c.returned);
    stages[5].h.record(a.handler_ns - a.received_ns);
    if (a.relay_ns == 0) {
      ++without_relay;
      return;
    }
    stages[3].h.record(a.relay_ns);
    stages[4].h.record(a.received_ns - c.returned - a.relay_ns);
  }
};

void print_budget(const nlohmann::json& b) {
  std::printf(
      "latency budget, %llu messages (%llu without the broker's relay time); percentiles of each "
      "stage, which do not add up:\n",
      static_cast<unsigned long long>(b["messages"].get<std::uint64_t>()),
      static_cast<unsigned long long>(b["without_relay_time"].get<std::uint64_t>()));
  std::printf("  %-44s %10s %10s %10s %10s\n", "stage (us)", "p50", "p90", "p99", "p99.9");
  for (const auto& s : b["stages"]) {
    const auto label = s["stage"].get<std::string>();
    if (s["latency"].is_null()) {
      std::printf("  %-44s %10s\n", label.c_str(), "not known");
      continue;
    }
    const auto& l = s["latency"];
    std::printf("  %-44s %10.1f %10.1f %10.1f %10.1f\n", label.c_str(), l["p50_us"].get<double>(),
                l["p90_us"].get<double>(), l["p99_us"].get<double>(), l["p99_9_us"].get<double>());
  }
}

void print_text(const nlohmann::json& report, bool fixed_rate) {
  const auto& jp = report["publishers"];
  const auto& js = report["subscribers"];
  const auto& a = report["aggregate"];
  for (std::size_t i = 0; i < jp.size(); ++i) {
    const auto& p = jp[i];
    const auto error = p["error"].get<std::string>();
    std::printf("publisher %zu: %llu msgs in %.2f s, %.0f msg/s, %.1f MB/s%s%s\n", i,
                static_cast<unsigned long long>(p["sent"].get<std::uint64_t>()), p["seconds"].get<double>(),
                p["msgs_per_s"].get<double>(), p["mb_per_s"].get<double>(), error.empty() ? "" : " ERROR ",
                error.c_str());
  }
  for (std::size_t i = 0; i < js.size(); ++i) {
    const auto& s = js[i];
    const auto& l = s["latency"];
    const auto error = s["error"].get<std::string>();
    std::printf(
        "subscriber %zu: %llu msgs, %.0f msg/s, %.1f MB/s, %llu reordered, latency p50 %.1f us p99 %.1f us "
        "max %.1f us%s%s\n",
        i, static_cast<unsigned long long>(s["received"].get<std::uint64_t>()), s["msgs_per_s"].get<double>(),
        s["mb_per_s"].get<double>(), static_cast<unsigned long long>(s["reordered"].get<std::uint64_t>()),
        l["p50_us"].get<double>(), l["p99_us"].get<double>(), l["max_us"].get<double>(),
        error.empty() ? "" : " ERROR ", error.c_str());
  }
  std::printf(
      "aggregate: published %llu (%.0f msg/s), received %llu of %llu (%.0f msg/s, %.1f MB/s), lost %llu, "
      "reordered %llu\n",
      static_cast<unsigned long long>(a["published"].get<std::uint64_t>()),
      a["publish_msgs_per_s"].get<double>(),
      static_cast<unsigned long long>(a["received"].get<std::uint64_t>()),
      static_cast<unsigned long long>(a["expected"].get<std::uint64_t>()),
      a["delivery_msgs_per_s"].get<double>(), a["delivery_mb_per_s"].get<double>(),
      static_cast<unsigned long long>(a["lost"].get<std::uint64_t>()),
      static_cast<unsigned long long>(a["reordered"].get<std::uint64_t>()));
  if (jp.size() > 1)
    std::printf("publisher fairness (Jain's index): %.3f\n", a["publisher_fairness"].get<double>());
  const auto& l = a["latency"];
  std::printf("latency: p50 %.1f us, p90 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us%s\n",
              l["p50_us"].get<double>(), l["p90_us"].get<double>(), l["p99_us"].get<double>(),
              l["p99_9_us"].get<double>(), l["max_us"].get<double>(),
              fixed_rate ? " (from the schedule: coordinated omission corrected)" : "");
  const auto& w = a["wakeups_per_message"];
  if (!w["clients"].is_null()) {
    std::printf("wake-ups per delivered message: clients %.2f, broker %s, total %s\n",
                w["clients"].get<double>(),
                w["broker"].is_null() ? "not counted (--admin-socket)"
                                      : std::to_string(w["broker"].get<double>()).c_str(),
                w["total"].is_null() ? "-" : std::to_string(w["total"].get<double>()).c_str());
  }
  if (fixed_rate) {
    const auto& f = a["latency_from_send"];
    std::printf(
        "latency from the publish call: p50 %.1f us, p90 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us\n",
        f["p50_us"].get<double>(), f["p90_us"].get<double>(), f["p99_us"].get<double>(),
        f["p99_9_us"].get<double>(), f["max_us"].get<double>());
  }
  if (a.contains("latency_budget")) print_budget(a["latency_budget"]);
}

}  // namespace

void add_bench_options(CLI::App& app, BenchOptions& opt) {
  app.add_option("subject", opt.subject, "Subject")->capture_default_str();
  app.add_option("-p,--pub", opt.publishers, "Publishers (each its own connection)")->capture_default_str();
  app.add_option("-m,--sub", opt.subscribers, "Subscribers (each its own connection)")->capture_default_str();
  app.add_option("--sub-server", opt.sub_urls,
                 "Subscribers connect here instead, in turn (comma-separated: brokers of a cluster)")
      ->delimiter(',');
  app.add_option("-q,--queue", opt.queue, "Subscribers join this queue group (each message to one of them)");
  app.add_option("--size", opt.size, "Payload bytes (at least 24)")->capture_default_str();
  app.add_option("-n,--count", opt.count, "Messages per publisher")->capture_default_str();
  app.add_option("-d,--duration", opt.duration_s, "Seconds per publisher (instead of --count)");
  app.add_option("-r,--rate", opt.rate,
                 "Messages/s per publisher (0: flat out); latency then counts from the schedule");
  app.add_flag("--json", opt.json, "JSON report");
  app.add_flag("--trace", opt.trace,
               "Latency budget: each message's time split into stages (publish call, the broker, both hops, "
               "the client library's hand-over), percentiles per stage");
  app.add_flag("!--quiet", opt.progress, "No progress lines");
}

namespace {

/// One benchmark: its connections, publisher threads and results.
class BenchRun {
 public:
  BenchRun(const BenchOptions& opt, std::string system, const Connect& connect)
      : opt_(opt), system_(std::move(system)), connect_(connect), results_(opt.publishers) {}

  int run() {
    if (!connect_all()) return 2;  // exit codes: client-lib/cli/main.cpp
    if (!opt_.json && opt_.progress) {
      std::cerr << "bench: " << system_ << ", " << opt_.publishers << " publisher(s) -> " << opt_.subscribers
                << " subscriber(s)" << (opt_.queue.empty() ? "" : " in queue group " + opt_.queue) << ", "
                << opt_.size << " B, "
                << (opt_.duration_s > 0 ? fmt_number(opt_.duration_s) + " s"
                                        : std::to_string(opt_.count) + " msgs")
                << " each, " << (opt_.rate > 0 ? fmt_number(opt_.rate) + " msg/s each" : "flat out") << ", "
                << pubs_.front()->describe() << "\n";
    }
    const auto before = wakeups();
    run_publishers();
    const std::uint64_t expected = wait_for_deliveries();
    const auto after = wakeups();
    if (before.clients && after.clients) wakeups_.clients = *after.clients - *before.clients;
    if (before.broker && after.broker) wakeups_.broker = *after.broker - *before.broker;
    close_all();
    return report(expected);
  }

 private:
  /// Subscribers first, each on its own connection, active before anyone publishes.
  bool connect_all() {
    for (std::uint32_t i = 0; i < opt_.subscribers; ++i) {
      std::string error;
      auto c = connect_(error, opt_.sub_urls.empty() ? opt_.url : opt_.sub_urls[i % opt_.sub_urls.size()]);
      if (!c) {
        std::cerr << "bench: subscriber " << i << ": " << error << "\n";
        return false;
      }
      states_.push_back(std::make_unique<SubscriberState>());
      SubscriberState* st = states_.back().get();
      st->trace = opt_.trace;
      if (auto e = c->subscribe(opt_.subject, opt_.queue, [st](const Received& r) { st->on_payload(r); });
          !e.empty()) {
        std::cerr << "bench: subscriber " << i << ": " << e << "\n";
        return false;
      }
      subs_.push_back(std::move(c));
    }
    for (std::uint32_t i = 0; i < opt_.publishers; ++i) {
      std::string error;
      auto c = connect_(error, opt_.url);
      if (!c) {
        std::cerr << "bench: publisher " << i << ": " << error << "\n";
        return false;
      }
      pubs_.push_back(std::move(c));
    }
    return true;
  }

  /// Publisher p's thread: its messages, on schedule at a fixed rate.
  void publish(std::uint32_t p) {
    std::vector<std::byte> payload(opt_.size, std::byte{0x5a});
    BenchEndpoint& c = *pubs_[p];
    // Wake on schedule: the default 50 us timer slack would be charged to
    // every message as latency at a fixed rate.
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::this_thread::sleep_until(start_);
    const auto t0 = Clock::now();
    const auto end =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.duration_s));
    const auto interval =
        opt_.rate > 0 ? std::chrono::duration<double>(1.0 / opt_.rate) : std::chrono::duration<double>(0);
    std::uint64_t seq = 0;
    for (;; ++seq) {
      if (opt_.duration_s > 0 ? Clock::now() >= end : seq >= opt_.count) break;
      Stamp s{p, 0, seq, 0};
      if (opt_.rate > 0) {
        // The schedule, not the moment we got round to it: a publisher held
        // up by back-pressure still charges the delay to the messages.
        const auto due =
            t0 + std::chrono::duration_cast<Clock::duration>(interval * static_cast<double>(seq));
        std::this_thread::sleep_until(due);
        s.sent_ns = due.time_since_epoch().count();
        const auto lag = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - due).count();
        s.lag_us = static_cast<std::uint32_t>(std::clamp<std::int64_t>(lag, 0, UINT32_MAX));
      } else {
        s.sent_ns = now_ns();
      }
      std::memcpy(payload.data(), &s, sizeof s);
      const std::int64_t call = opt_.trace ? now_ns() : 0;
      if (auto e = c.publish(opt_.subject, payload, opt_.rate <= 0); !e.empty()) {
        results_[p].error = e;
        break;
      }
      if (opt_.trace) results_[p].calls.push_back({opt_.rate > 0 ? s.sent_ns : call, call, now_ns()});
      published_.fetch_add(1, std::memory_order_relaxed);
    }
    if (auto e = c.flush(60s); !e.empty() && results_[p].error.empty()) results_[p].error = e;
    results_[p].sent = seq;
    results_[p].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  /// Every publisher on its thread, all starting together; progress once a
  /// second while they publish.
  void run_publishers() {
    start_ = Clock::now() + 50ms;
    std::vector<std::thread> threads;
    for (std::uint32_t p = 0; p < opt_.publishers; ++p) threads.emplace_back([this, p] { publish(p); });
    std::atomic<bool> publishing{true};
    std::thread progress([&] {
      auto last = Clock::now();
      std::uint64_t last_pub = 0;
      int tick = 0;
      while (publishing.load()) {
        std::this_thread::sleep_for(100ms);
        if (Clock::now() - last < 1s) continue;
        const std::uint64_t p = published_.load();
        if (!opt_.json && opt_.progress) {
          std::fprintf(
              stderr, "[%2ds] published %llu (%.0f msg/s), received %llu\n", ++tick,
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
  }

  /// Wake-ups of every client and of the broker so far, where counted.
  struct Wakeups {
    std::optional<std::uint64_t> clients, broker;
  };
  Wakeups wakeups() const {
    Wakeups w;
    for (const auto* list : {&subs_, &pubs_}) {
      for (const auto& c : *list) {
        if (auto n = c->wakeups()) w.clients = w.clients.value_or(0) + *n;
      }
    }
    if (opt_.broker_wakeups) w.broker = opt_.broker_wakeups();
    return w;
  }

  std::uint64_t received_total() const {
    std::uint64_t n = 0;
    for (const auto& s : states_) n += s->count.load(std::memory_order_relaxed);
    return n;
  }

  /// Waits for deliveries: all of them, or until nothing arrives for 5 s.
  /// Returns how many were expected.
  std::uint64_t wait_for_deliveries() const {
    std::uint64_t total_sent = 0;
    for (const auto& r : results_) total_sent += r.sent;
    const std::uint64_t expected =
        opt_.queue.empty() ? total_sent * opt_.subscribers : (opt_.subscribers > 0 ? total_sent : 0);
    auto last_change = Clock::now();
    std::uint64_t seen = received_total();
    while (seen < expected && Clock::now() - last_change < 5s) {
      std::this_thread::sleep_for(10ms);
      if (const auto n = received_total(); n != seen) {
        seen = n;
        last_change = Clock::now();
      }
    }
    return expected;
  }

  void close_all() {
    for (std::size_t i = 0; i < subs_.size(); ++i) {
      auto why = subs_[i]->close();
      std::lock_guard l(states_[i]->mu);
      if (states_[i]->error.empty()) states_[i]->error = why;
    }
    for (std::size_t i = 0; i < pubs_.size(); ++i) {
      if (auto why = pubs_[i]->close(); !why.empty() && results_[i].error.empty()) results_[i].error = why;
    }
  }

  /// Prints the report (text or JSON); the exit status: 1 if anything failed or was lost.
  int report(std::uint64_t expected) {
    const double start_ns = static_cast<double>(start_.time_since_epoch().count());
    nlohmann::json report;
    report["system"] = system_;
    report["config"] = {
        {"url", opt_.url},     {"sub_urls", opt_.sub_urls},     {"subject", opt_.subject},
        {"queue", opt_.queue}, {"publishers", opt_.publishers}, {"subscribers", opt_.subscribers},
        {"size", opt_.size},   {"count", opt_.count},           {"duration_s", opt_.duration_s},
        {"rate", opt_.rate}};
    nlohmann::json jp = nlohmann::json::array();
    double pub_seconds = 0;
    std::uint64_t total_sent = 0;
    bool failed = false;
    for (const auto& r : results_) {
      pub_seconds = std::max(pub_seconds, r.seconds);
      total_sent += r.sent;
      const auto n = static_cast<double>(r.sent);
      jp.push_back({{"sent", r.sent},
                    {"seconds", r.seconds},
                    {"msgs_per_s", per_second(n, r.seconds)},
                    {"mb_per_s", per_second(n * opt_.size, r.seconds) / 1e6},
                    {"error", r.error}});
      failed |= !r.error.empty();
    }
    nlohmann::json js = nlohmann::json::array();
    LatencyHistogram all, all_from_send;
    std::uint64_t received = 0, reordered = 0, malformed = 0;
    double last_ns = 0;
    for (auto& s : states_) {
      std::lock_guard l(s->mu);
      const double secs = s->last_ns > 0 ? (static_cast<double>(s->last_ns) - start_ns) / 1e9 : 0;
      const auto n = static_cast<double>(s->received);
      js.push_back({{"received", s->received},
                    {"reordered", s->reordered},
                    {"malformed", s->malformed},
                    {"seconds", secs},
                    {"msgs_per_s", per_second(n, secs)},
                    {"mb_per_s", per_second(n * opt_.size, secs) / 1e6},
                    {"latency", to_json(s->latency)},
                    {"error", s->error}});
      received += s->received;
      reordered += s->reordered;
      malformed += s->malformed;
      last_ns = std::max(last_ns, static_cast<double>(s->last_ns));
      all.merge(s->latency);
      all_from_send.merge(s->latency_from_send);
      failed |= !s->error.empty();
    }
    const std::uint64_t lost = expected > received ? expected - received : 0;
    // Jain's index over what each publisher got through: 1 when all publish
    // at the same rate, 1/n when one takes everything (--duration runs).
    double sum = 0, sum_sq = 0;
    for (const auto& r : results_) {
      sum += static_cast<double>(r.sent);
      sum_sq += static_cast<double>(r.sent) * static_cast<double>(r.sent);
    }
    const double fairness = sum_sq > 0 ? sum * sum / (static_cast<double>(results_.size()) * sum_sq) : 1.0;
    const double delivery_s = last_ns > 0 ? (last_ns - start_ns) / 1e9 : 0;
    report["publishers"] = jp;
    report["subscribers"] = js;
    report["aggregate"] = {
        {"published", total_sent},
        {"publish_msgs_per_s", per_second(static_cast<double>(total_sent), pub_seconds)},
        {"publisher_fairness", fairness},
        {"expected", expected},
        {"received", received},
        {"lost", lost},
        {"reordered", reordered},
        {"malformed", malformed},
        {"delivery_seconds", delivery_s},
        {"delivery_msgs_per_s", per_second(static_cast<double>(received), delivery_s)},
        {"delivery_mb_per_s", per_second(static_cast<double>(received) * opt_.size, delivery_s) / 1e6},
        {"latency", to_json(all)},
        {"latency_from_send", to_json(all_from_send)}};
    // Wake-ups per delivered message (issue 16's bar: at most 2 in default
    // mode at light load, 0 fully polled); null where not counted.
    const auto per_message = [&](const std::optional<std::uint64_t>& n) -> nlohmann::json {
      if (!n.has_value() || received == 0) return nullptr;
      return static_cast<double>(n.value()) / static_cast<double>(received);
    };
    nlohmann::json total = nullptr;
    if (wakeups_.clients.has_value() && wakeups_.broker.has_value() && received > 0) {
      total = static_cast<double>(wakeups_.clients.value() + wakeups_.broker.value()) /
              static_cast<double>(received);
    }
    report["aggregate"]["wakeups_per_message"] = {{"clients", per_message(wakeups_.clients)},
                                                  {"broker", per_message(wakeups_.broker)},
                                                  {"total", total}};
    if (opt_.trace) report["aggregate"]["latency_budget"] = budget();
    if (opt_.json) {
      std::cout << report.dump(2) << "\n";
    } else {
      print_text(report, opt_.rate > 0);
    }
    return failed || lost > 0 || malformed > 0 ? 1 : 0;
  }

  /// --trace: every message received, joined to its publish call.
  nlohmann::json budget() {
    Budget b;
    for (auto& s : states_) {
      std::lock_guard l(s->mu);
      for (const Arrival& a : s->arrivals) {
        if (a.publisher >= results_.size()) continue;  // not a stamp of ours: counted as malformed
        const auto& calls = results_[a.publisher].calls;
        if (a.seq < calls.size()) b.add(calls[a.seq], a);
      }
    }
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& st : b.stages) {
      stages.push_back({{"key", st.key},
                        {"stage", st.label},
                        {"latency", st.h.count() == 0 ? nlohmann::json(nullptr) : to_json(st.h)}});
    }
    return {{"messages", b.traced}, {"without_relay_time", b.without_relay}, {"stages", stages}};
  }

  const BenchOptions& opt_;
  const std::string system_;
  const Connect& connect_;
  std::vector<std::unique_ptr<SubscriberState>> states_;
  std::vector<std::unique_ptr<BenchEndpoint>> subs_;
  std::vector<std::unique_ptr<BenchEndpoint>> pubs_;
  std::vector<PublisherResult> results_;
  std::atomic<std::uint64_t> published_{0};
  Clock::time_point start_{};  // when every publisher starts
  Wakeups wakeups_;            // during the measurement
};

}  // namespace

int run_bench(const BenchOptions& opt, const std::string& system, const Connect& connect) {
  if (opt.size < sizeof(Stamp)) {
    std::cerr << "bench: --size must be at least " << sizeof(Stamp) << " bytes (the stamp)\n";
    return 2;
  }
  if (opt.publishers == 0) {
    std::cerr << "bench: at least one publisher\n";
    return 2;
  }
  return BenchRun(opt, system, connect).run();
}

int driver_main(int argc, char** argv, const std::string& system, const std::string& default_url,
                const std::function<Connect(const BenchOptions& opt)>& make_connect) {
  CLI::App app{system + " pub/sub benchmark driver: the measurement of `rdmabroker bench`, on " + system};
  BenchOptions opt;
  opt.url = default_url;
  add_bench_options(app, opt);
  app.add_option("-s,--server", opt.url, "Server URL")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return run_bench(opt, system, make_connect(opt));
}

}  // namespace rdmabroker::bench
