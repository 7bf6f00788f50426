// SPDX-License-Identifier: Apache-2.0
#include "ops/rate_meter.hpp"

namespace rdmabroker::daemon {

namespace {
std::int64_t get(const StatsSnapshot& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? 0 : it->second;
}
}  // namespace

void RateMeter::sample(const StatsSnapshot& s, Clock::time_point now) {
  if (!window_.empty() && now - window_.back().at < std::chrono::milliseconds(900)) return;
  window_.push_back(Sample{now, get(s, "messages.in"), get(s, "messages.delivered"), get(s, "bytes.in"),
                           get(s, "bytes.out")});
  while (window_.size() > kSamples) window_.pop_front();
}

void RateMeter::add_rates(StatsSnapshot& s) const {
  std::int64_t in = 0, out = 0, bin = 0, bout = 0;
  if (window_.size() >= 2) {
    const Sample& a = window_.front();
    const Sample& b = window_.back();
    const double dt = std::chrono::duration<double>(b.at - a.at).count();
    if (dt > 0) {
      in = static_cast<std::int64_t>(static_cast<double>(b.messages_in - a.messages_in) / dt);
      out = static_cast<std::int64_t>(static_cast<double>(b.messages_out - a.messages_out) / dt);
      bin = static_cast<std::int64_t>(static_cast<double>(b.bytes_in - a.bytes_in) / dt);
      bout = static_cast<std::int64_t>(static_cast<double>(b.bytes_out - a.bytes_out) / dt);
    }
  }
  s["rates.messages_in_per_s"] = in;
  s["rates.messages_out_per_s"] = out;
  s["rates.bytes_in_per_s"] = bin;
  s["rates.bytes_out_per_s"] = bout;
}

}  // namespace rdmabroker::daemon
