// SPDX-License-Identifier: Apache-2.0
#include "fault/fault.hpp"

#include <charconv>
#include <cstdlib>
#include <vector>

namespace rdmabroker::daemon::fault {
namespace {

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < s.size() && s[i] != ' ') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

template <typename T>
bool number(std::string_view s, T& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

Error usage(const std::string& why) {
  return Error{ErrorKind::kInvalidArgument,
               why +
                   " (usage: fault wc-error CONN | qp-error CONN | cm-duplicate N | cm-delay MS N | "
                   "pool-exhaust | pool-release | mcast-drop N | mcast-join-fail N | worker-stall MS | "
                   "route-stall MS | sync-fail N)"};
}

}  // namespace

Result<Spec> parse(std::string_view args) {
  const auto w = words(args);
  if (w.empty()) return usage("no fault named");
  Spec spec;
  const std::string_view name = w[0];
  auto want = [&](std::size_t n) { return w.size() == n + 1; };
  if (name == "wc-error" || name == "qp-error") {
    spec.kind = name == "wc-error" ? Kind::kWcError : Kind::kQpError;
    if (!want(1) || !number(w[1], spec.connection))
      return usage(std::string(name) + " needs a connection id");
  } else if (name == "cm-duplicate") {
    spec.kind = Kind::kCmDuplicate;
    if (!want(1) || !number(w[1], spec.count) || spec.count == 0) return usage("cm-duplicate needs a count");
  } else if (name == "mcast-drop" || name == "mcast-join-fail" || name == "sync-fail") {
    spec.kind = name == "mcast-drop"  ? Kind::kMcastDrop
                : name == "sync-fail" ? Kind::kSyncFail
                                      : Kind::kMcastJoinFail;
    if (!want(1) || !number(w[1], spec.count) || spec.count == 0)
      return usage(std::string(name) + " needs a count");
  } else if (name == "cm-delay") {
    spec.kind = Kind::kCmDelay;
    if (!want(2) || !number(w[1], spec.delay_ms) || !number(w[2], spec.count) || spec.count == 0) {
      return usage("cm-delay needs milliseconds and a count");
    }
  } else if (name == "worker-stall" || name == "route-stall") {
    spec.kind = name == "worker-stall" ? Kind::kWorkerStall : Kind::kRouteStall;
    if (!want(1) || !number(w[1], spec.delay_ms) || spec.delay_ms == 0)
      return usage(std::string(name) + " needs milliseconds");
  } else if (name == "pool-exhaust") {
    spec.kind = Kind::kPoolExhaust;
    if (!want(0)) return usage("pool-exhaust takes no argument");
  } else if (name == "pool-release") {
    spec.kind = Kind::kPoolRelease;
    if (!want(0)) return usage("pool-release takes no argument");
  } else {
    return usage("unknown fault '" + std::string(name) + "'");
  }
  return spec;
}

bool Shared::take(std::atomic<std::uint32_t>& counter) {
  std::uint32_t n = counter.load(std::memory_order_relaxed);
  while (n > 0 && !counter.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
  }
  return n > 0;
}

std::uint32_t cq_entries_override() {
  if constexpr (!kEnabled) return 0;
  const char* v = std::getenv("RDMABROKER_FAULT_CQ_ENTRIES");
  std::uint32_t n = 0;
  if (v == nullptr || !number(std::string_view(v), n)) return 0;
  return n;
}

}  // namespace rdmabroker::daemon::fault
