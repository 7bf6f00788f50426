// SPDX-License-Identifier: Apache-2.0
#include "latency_histogram.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace rdmabroker::bench {
namespace {

TEST(LatencyHistogram, EmptyReportsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.quantile_us(0.5), 0);
  EXPECT_EQ(h.max_us(), 0);
}

TEST(LatencyHistogram, SmallValuesAreExact) {
  LatencyHistogram h;
  for (int ns = 1; ns <= 50; ++ns) h.record(ns);
  EXPECT_DOUBLE_EQ(h.quantile_us(0.5), 0.025);  // the 25th of 50
  EXPECT_DOUBLE_EQ(h.quantile_us(1.0), 0.050);
  EXPECT_DOUBLE_EQ(h.max_us(), 0.050);
}

TEST(LatencyHistogram, QuantilesWithinBucketPrecisionOfSortedSamples) {
  // Latency-like samples over six decades (1 us .. 1 s): each reported
  // quantile must be within 1/64 of the exact one.
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(11.0, 2.0);
  LatencyHistogram h;
  std::vector<std::int64_t> v;
  for (int i = 0; i < 100000; ++i) {
    const auto ns = static_cast<std::int64_t>(std::clamp(dist(rng), 1e3, 1e9));
    v.push_back(ns);
    h.record(ns);
  }
  std::sort(v.begin(), v.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const double exact = static_cast<double>(v[static_cast<std::size_t>(q * v.size() + 0.5) - 1]) / 1000.0;
    EXPECT_NEAR(h.quantile_us(q), exact, exact / 64.0) << "q=" << q;
  }
  EXPECT_DOUBLE_EQ(h.max_us(), static_cast<double>(v.back()) / 1000.0);
}

TEST(LatencyHistogram, MergeEqualsRecordingEverythingInOne) {
  LatencyHistogram a, b, all;
  for (std::int64_t ns = 100; ns < 2'000'000; ns = ns * 3 / 2) {
    (ns % 2 ? a : b).record(ns);
    all.record(ns);
  }
  a.merge(b);
  for (double q : {0.1, 0.5, 0.9, 1.0}) EXPECT_DOUBLE_EQ(a.quantile_us(q), all.quantile_us(q));
  EXPECT_DOUBLE_EQ(a.max_us(), all.max_us());
}

TEST(LatencyHistogram, NegativeClampedAndHugeValuesKept) {
  LatencyHistogram h;
  h.record(-5);  // a clock step: counted as 0, never an out-of-range bucket
  h.record(INT64_MAX);
  EXPECT_EQ(h.quantile_us(0.5), 0);
  EXPECT_DOUBLE_EQ(h.max_us(), static_cast<double>(INT64_MAX) / 1000.0);
  EXPECT_GT(h.quantile_us(1.0), 9e12);
}

}  // namespace
}  // namespace rdmabroker::bench
