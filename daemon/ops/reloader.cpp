#include "ops/reloader.hpp"

#include <spdlog/spdlog.h>

#include "ops/logging.hpp"

namespace rdmabroker::daemon {

Result<config::Config> read_config(const std::string& path, const Reloader::Overrides& overrides) {
  auto c = path.empty() ? config::parse("", "(defaults)") : config::load(path);
  if (!c) return c.error();
  if (overrides) overrides(c.value());
  return c;
}

Reloader::Outcome Reloader::reload() {
  notifier_.reloading();
  Outcome out;
  const std::string source = path_.empty() ? "the built-in defaults" : path_;
  auto next = read_config(path_, overrides_);
  if (!next) {
    ++failed_;
    out.message = "reload failed, running configuration unchanged:\n" + next.error().message;
    spdlog::error("{}", out.message);
    notifier_.reloaded("running; last reload failed: invalid configuration");
    return out;
  }
  out.changes = config::diff(running_, next.value());
  std::vector<config::Change> fixed;
  for (const auto& c : out.changes) {
    if (!c.live) fixed.push_back(c);
  }
  if (!fixed.empty()) {
    ++refused_;
    out.message = "reload refused, running configuration unchanged: ";
    for (std::size_t i = 0; i < fixed.size(); ++i) {
      out.message += (i ? "; " : "") + fixed[i].key + " changed (" + fixed[i].from + " -> " + fixed[i].to + ")";
    }
    out.message += fixed.size() == 1 ? " and cannot change while running (restart to apply it)"
                                     : " and cannot change while running (restart to apply them)";
    out.changes = std::move(fixed);
    spdlog::error("{}", out.message);
    notifier_.reloaded("running; last reload refused");
    return out;
  }
  ++ok_;
  out.ok = true;
  if (out.changes.empty()) {
    out.message = "reloaded " + source + ": no changes";
  } else {
    apply_log_settings(next->log);
    broker_.apply_live(next->broker);
    out.message = "reloaded " + source + ":";
    for (const auto& c : out.changes) out.message += " " + c.key + " " + c.from + " -> " + c.to + ";";
    out.message.pop_back();
  }
  running_ = std::move(next.value());
  spdlog::info("{}", out.message);
  notifier_.reloaded("running; configuration reloaded");
  return out;
}

void Reloader::add_counters(StatsSnapshot& s) const {
  s["reloads.ok"] = static_cast<std::int64_t>(ok_.load());
  s["reloads.refused"] = static_cast<std::int64_t>(refused_.load());
  s["reloads.failed"] = static_cast<std::int64_t>(failed_.load());
}

}  // namespace rdmabroker::daemon
