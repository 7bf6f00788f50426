// SPDX-License-Identifier: Apache-2.0
// rdmabroker consume STREAM: read a stream through a consumer
// (docs/streams.md): print each message with its stream sequence, and
// acknowledge it with --ack.
#include <ctime>
#include <iostream>
#include <optional>

#include "commands.hpp"
#include "rdmabroker/consumer.hpp"

namespace rdmabroker::cli {
namespace {

struct ConsumeArgs {
  Common common;
  std::string stream, durable, since;
  std::uint64_t count = 0, from = 0, batch = 0;
  bool last = false, last_per_subject = false, fresh = false, ack = false, raw = false;
  double timeout = 0;
};

/// --since: an age ("90s", "10m", "2h", "1d") or a UTC time ("2026-12-02T06:00:00Z").
std::optional<std::chrono::system_clock::time_point> parse_since(const std::string& s) {
  const auto now = std::chrono::system_clock::now();
  char* end = nullptr;
  const double n = std::strtod(s.c_str(), &end);
  if (end != s.c_str() && end[0] != '\0' && end[1] == '\0' && n >= 0) {
    const double unit = *end == 's' ? 1 : *end == 'm' ? 60 : *end == 'h' ? 3600 : *end == 'd' ? 86400 : 0;
    if (unit == 0) return std::nullopt;
    return now - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                     std::chrono::duration<double>(n * unit));
  }
  std::tm tm{};
  const char* rest = ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr || (*rest != '\0' && std::string_view(rest) != "Z")) return std::nullopt;
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

int run_consume(const ConsumeArgs& a) {
  ConsumerOptions opt;
  opt.durable = a.durable;
  opt.ack = a.ack ? ConsumerOptions::Ack::kExplicit : ConsumerOptions::Ack::kNone;
  opt.pull = a.batch != 0;
  // No more outstanding than it will print: what it leaves is not redelivered at once.
  if (a.count != 0) opt.max_ack_pending = static_cast<std::uint32_t>(std::min<std::uint64_t>(a.count, 1024));
  if (a.from != 0) {
    opt.start = ConsumerOptions::Start::kSequence;
    opt.start_sequence = a.from;
  } else if (!a.since.empty()) {
    const auto t = parse_since(a.since);
    if (!t) {
      std::cerr
          << "rdmabroker: --since takes an age (90s, 10m, 2h, 1d) or a UTC time (2026-12-02T06:00:00Z)\n";
      return kExitUsage;
    }
    opt.start = ConsumerOptions::Start::kTime;
    opt.start_time = *t;
  } else if (a.last) {
    opt.start = ConsumerOptions::Start::kLast;
  } else if (a.last_per_subject) {
    opt.start = ConsumerOptions::Start::kLastPerSubject;
  } else if (a.fresh) {
    opt.start = ConsumerOptions::Start::kNew;
  }
  auto client = connect_or_die(a.common);
  auto c = client->consume(a.stream, opt, std::chrono::seconds(10));
  if (!c) return die(c.error());
  Consumer& consumer = *c.value();
  // Scripts wait for this line to know the consumer is open.
  std::cerr << "consuming " << a.stream << (a.durable.empty() ? "" : " as " + a.durable) << ": "
            << consumer.pending_at_open() << " message(s) pending\n";
  std::uint64_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.timeout);
  const auto show = [&](const Message& m) -> int {
    ++got;
    if (a.raw) {
      std::cout << m.data() << "\n";
    } else {
      std::cout << "[" << a.stream << " #" << m.stream_sequence << (m.deliveries > 1 ? " redelivered" : "")
                << "] " << m.subject << ": " << m.data() << "\n";
      for (const auto& [name, value] : m.headers) std::cout << "  " << name << ": " << value << "\n";
    }
    std::cout.flush();
    if (a.ack) {
      if (auto st = consumer.ack(m); !st) return die(st.error());
    }
    return 0;
  };
  while ((a.count == 0 || got < a.count) && !g_interrupted) {
    if (a.timeout > 0 && std::chrono::steady_clock::now() >= deadline) {
      std::cerr << "rdmabroker: timed out after " << got << " message(s)\n";
      return kExitTimeout;
    }
    if (opt.pull) {
      const std::size_t want = a.count == 0 ? a.batch : std::min<std::uint64_t>(a.batch, a.count - got);
      auto batch = consumer.fetch(want, std::chrono::milliseconds(500));
      if (!batch) return die(batch.error());
      for (const auto& m : batch.value()) {
        if (int rc = show(m); rc != 0) return rc;
      }
      continue;
    }
    auto m = consumer.next(std::chrono::milliseconds(200));
    if (!m) {
      if (m.error().kind == ErrorKind::kTimeout) continue;
      return die(m.error());
    }
    if (int rc = show(*m); rc != 0) return rc;
  }
  // Acknowledgements are frames like any other: flushed before the close.
  (void)client->flush(std::chrono::seconds(5));
  (void)consumer.close();
  client->close();
  return 0;
}

}  // namespace

Subcommand add_consume(CLI::App& app) {
  auto a = std::make_shared<ConsumeArgs>();
  auto* cmd =
      app.add_subcommand("consume", "Read a stream through a consumer; print each message with its sequence");
  cmd->add_option("stream", a->stream, "Stream name")->required();
  cmd->add_option("--durable", a->durable, "A durable consumer's name: it resumes where it stands");
  cmd->add_option("-n,--count", a->count, "Exit after this many messages (0: run until interrupted)")
      ->capture_default_str();
  auto* from = cmd->add_option("--from", a->from, "Start at this stream sequence");
  auto* since =
      cmd->add_option("--since", a->since, "Start at this age (10m, 2h) or UTC time")->excludes(from);
  auto* last =
      cmd->add_flag("--last", a->last, "Start with the stream's last message")->excludes(from, since);
  auto* per = cmd->add_flag("--last-per-subject", a->last_per_subject,
                            "Start with the last message of each subject (latest value per key)")
                  ->excludes(from, since, last);
  cmd->add_flag("--new", a->fresh, "Only messages stored from now on")->excludes(from, since, last, per);
  cmd->add_flag("--ack", a->ack,
                "Acknowledge each message once printed (unacknowledged ones are delivered again)");
  cmd->add_option("--batch", a->batch, "Pull consumer: fetch this many at a time (0: push)");
  cmd->add_flag("--raw", a->raw, "Print only the payload");
  cmd->add_option("--timeout", a->timeout, "Fail (exit 3) if not done after this many seconds");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_consume(*a); }};
}

}  // namespace rdmabroker::cli
