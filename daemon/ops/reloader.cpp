// SPDX-License-Identifier: Apache-2.0
#include "ops/reloader.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "ops/logging.hpp"

namespace rdmabroker::daemon {

Result<config::Config> read_file_config(const std::string& path) {
  return path.empty() ? config::parse("", "(defaults)") : config::load(path);
}

Reloader::Outcome Reloader::reload() {
  notifier_.reloading();
  Outcome out;
  const std::string source = path_.empty() ? "the built-in defaults" : path_;
  // A reload that cannot apply: counted, logged, told to systemd; nothing changed.
  const auto failed = [&](const std::string& why, const char* status) {
    ++failed_;
    out.message = "reload failed, running configuration unchanged:" + why;
    spdlog::error("{}", out.message);
    notifier_.reloaded(std::string("running; last reload failed: ") + status);
    return out;
  };
  auto next_file = read_file_config(path_);
  if (!next_file) return failed("\n" + next_file.error().message, "invalid configuration");
  config::Config next = next_file.value();
  command_line_.apply(next);
  if (auto valid = config::validate(next); !valid) {
    return failed(" with the command-line flags: " + valid.error().message, "invalid configuration");
  }
  out.changes = config::diff(running_, next);
  for (const auto& c : config::diff(file_, next_file.value())) {
    const bool effective =
        std::any_of(out.changes.begin(), out.changes.end(), [&](const auto& e) { return e.key == c.key; });
    if (effective) continue;
    std::vector<std::string> flags;  // each flag once, however many parts of the key it sets
    for (const auto& f : command_line_.flags) {
      const bool sets = std::any_of(f.keys.begin(), f.keys.end(), [&](const std::string& k) {
        return k == c.key || k.starts_with(c.key + ":");
      });
      if (sets && std::find(flags.begin(), flags.end(), f.name) == flags.end()) flags.push_back(f.name);
    }
    std::string names;
    for (const auto& f : flags) names += (names.empty() ? "" : ", ") + f;
    out.overridden.push_back(c.key + " (" + c.from + " -> " + c.to + ") overridden by " + names);
  }
  std::string masked;
  for (const auto& o : out.overridden) masked += "; in the file only: " + o;
  std::vector<config::Change> fixed;
  for (const auto& c : out.changes) {
    if (!c.live) fixed.push_back(c);
  }
  if (!fixed.empty()) {
    ++refused_;
    out.message = "reload refused, running configuration unchanged: ";
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      out.message +=
          (i ? "; " : "") + fixed[i].key + " changed (" + fixed[i].from + " -> " + fixed[i].to + ")";
    }
    out.message += fixed.size() == 1 ? " and cannot change while running (restart to apply it)"
                                     : " and cannot change while running (restart to apply them)";
    out.changes = std::move(fixed);
    out.message += masked;
    spdlog::error("{}", out.message);
    notifier_.reloaded("running; last reload refused");
    return out;
  }
  // TLS files are read on every reload, changed or not: renewing a
  // certificate at the same path and reloading is how it is rotated.
  auto tls = broker_.load_tls(next.broker.tls);
  if (!tls) return failed(" " + tls.error().message, "TLS files");
  if (!tls->empty()) masked += "; tls: " + *tls;
  ++ok_;
  out.ok = true;
  if (out.changes.empty()) {
    out.message = "reloaded " + source + ": no changes";
  } else {
    apply_log_settings(next.log);
    broker_.apply_live(next.broker);
    out.message = "reloaded " + source + ":";
    for (const auto& c : out.changes) out.message += " " + c.key + " " + c.from + " -> " + c.to + ";";
    out.message.pop_back();
  }
  out.message += masked;
  running_ = std::move(next);
  file_ = std::move(next_file.value());
  spdlog::info("{}", out.message);
  notifier_.reloaded("running; configuration reloaded");
  return out;
}

void Reloader::visit_stats(StatsVisitor& v) const {
  const auto outcome = [&v](std::string_view name, const std::atomic<std::uint64_t>& n) {
    v.counter({"reloads." + std::string(name), "rdmabroker_reloads_total",
               "Configuration reloads, by outcome.", "outcome", std::string(name)},
              n.load());
  };
  outcome("ok", ok_);
  outcome("refused", refused_);
  outcome("failed", failed_);
}

}  // namespace rdmabroker::daemon
