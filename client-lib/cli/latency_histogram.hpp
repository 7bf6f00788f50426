// SPDX-License-Identifier: Apache-2.0
// The latency histogram of `rdmabroker bench` and the benchmark drivers.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace rdmabroker::bench {

/// Latencies in nanoseconds, log-linear buckets (HdrHistogram's layout with
/// 64 sub-buckets per power of two): values below 64 ns exact, above that
/// within 1/64 (1.6 %); fixed size, so a long run costs no memory per message.
class LatencyHistogram {
 public:
  void record(std::int64_t ns) {
    const auto v = static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 0));
    ++counts_[index(v)];
    ++total_;
    max_ = std::max(max_, v);
  }
  void merge(const LatencyHistogram& o) {
    for (std::size_t i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
    total_ += o.total_;
    max_ = std::max(max_, o.max_);
  }
  /// The value at quantile q (0..1), in microseconds: the middle of its bucket.
  double quantile_us(double q) const {
    if (total_ == 0) return 0;
    const auto rank =
        std::max<std::uint64_t>(1, static_cast<std::uint64_t>(q * static_cast<double>(total_) + 0.5));
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min(static_cast<double>(middle(i)), static_cast<double>(max_)) / 1000.0;
    }
    return static_cast<double>(max_) / 1000.0;
  }
  double max_us() const { return static_cast<double>(max_) / 1000.0; }
  std::uint64_t count() const { return total_; }

 private:
  static constexpr unsigned kSubBits = 6;
  static constexpr std::uint64_t kSub = 1u << kSubBits;
  static constexpr std::size_t kBuckets = kSub + (64 - kSubBits) * kSub;

  static std::size_t index(std::uint64_t v) {
    if (v < kSub) return v;
    const unsigned e = static_cast<unsigned>(std::bit_width(v)) - 1;  // >= kSubBits
    const std::uint64_t sub = (v >> (e - kSubBits)) - kSub;           // 0..kSub-1
    return kSub + (e - kSubBits) * kSub + sub;
  }
  static std::uint64_t middle(std::size_t i) {
    if (i < kSub) return i;
    const std::size_t e = (i - kSub) / kSub;  // exponent above kSubBits
    const std::uint64_t lower = (kSub + (i - kSub) % kSub) << e;
    return lower + ((std::uint64_t{1} << e) >> 1);
  }

  std::array<std::uint64_t, kBuckets> counts_{};
  std::uint64_t total_ = 0;
  std::uint64_t max_ = 0;
};

}  // namespace rdmabroker::bench
