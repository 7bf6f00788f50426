// SPDX-License-Identifier: Apache-2.0
// Subject relations (proto/subjects.hpp) against their definitions, checked
// by enumerating every subject of a small universe: `matches` by the plain
// token definition, `covers` and `intersect` by what the patterns match.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::proto {
namespace {

// Subjects of one to five tokens over {a, b, c}: patterns below use only a
// and b as literals, so c stands for "any other token".
std::vector<std::string> universe() {
  std::vector<std::string> out;
  std::vector<std::string> level{"a", "b", "c"};
  for (int len = 1; len <= 5; ++len) {
    out.insert(out.end(), level.begin(), level.end());
    std::vector<std::string> next;
    for (const auto& s : level)
      for (const char* t : {"a", "b", "c"}) next.push_back(s + "." + t);
    level = std::move(next);
  }
  return out;
}

std::string random_pattern(std::mt19937& rng) {
  const int len = 1 + static_cast<int>(rng() % 4);
  std::string p;
  for (int i = 0; i < len; ++i) {
    if (i) p += '.';
    const auto r = rng() % 8;
    if (i == len - 1 && r == 0)
      p += '>';
    else if (r < 3)
      p += '*';
    else
      p += (r % 2 ? "a" : "b");
  }
  return p;
}

TEST(Subjects, MatchesByExample) {
  EXPECT_TRUE(pattern_matches("orders.eu", "orders.eu"));
  EXPECT_FALSE(pattern_matches("orders.eu", "orders.us"));
  EXPECT_TRUE(pattern_matches("orders.*", "orders.us"));
  EXPECT_FALSE(pattern_matches("orders.*", "orders.us.created"));
  EXPECT_TRUE(pattern_matches("orders.>", "orders.us.created"));
  EXPECT_FALSE(pattern_matches("orders.>", "orders"));
  EXPECT_TRUE(pattern_matches(">", "x"));
  EXPECT_FALSE(pattern_matches("orders", "orders.eu"));
}

TEST(Subjects, CoversAndIntersectByExample) {
  EXPECT_TRUE(pattern_covers(">", "orders.*"));
  EXPECT_TRUE(pattern_covers("orders.>", "orders.*.created"));
  EXPECT_FALSE(pattern_covers("orders.*", "orders.>"));
  EXPECT_FALSE(pattern_covers("orders.eu", "orders.*"));
  EXPECT_TRUE(pattern_covers("orders.*", "orders.eu"));
  EXPECT_TRUE(patterns_intersect(">", "secret.x"));
  EXPECT_TRUE(patterns_intersect("orders.*", "*.eu"));
  EXPECT_FALSE(patterns_intersect("orders.*", "orders"));
  EXPECT_FALSE(patterns_intersect("orders.>", "orders"));
}

TEST(Subjects, RelationsAgreeWithTheirDefinitionsOnEverySubject) {
  const auto subjects = universe();
  std::mt19937 rng(7);
  for (int round = 0; round < 3000; ++round) {
    const std::string p = random_pattern(rng), q = random_pattern(rng);
    ASSERT_TRUE(valid_pattern(p) && valid_pattern(q)) << p << " " << q;
    bool p_has_all_of_q = true, some_in_both = false;
    for (const auto& s : subjects) {
      const bool in_p = pattern_matches(p, s), in_q = pattern_matches(q, s);
      if (in_q && !in_p) p_has_all_of_q = false;
      if (in_p && in_q) some_in_both = true;
    }
    EXPECT_EQ(pattern_covers(p, q), p_has_all_of_q) << p << " covers " << q;
    EXPECT_EQ(patterns_intersect(p, q), some_in_both) << p << " meets " << q;
    EXPECT_EQ(patterns_intersect(p, q), patterns_intersect(q, p)) << p << " " << q;
    if (valid_subject(q)) {
      EXPECT_EQ(pattern_matches(p, q), pattern_covers(p, q)) << p << " " << q;
    }
  }
}

}  // namespace
}  // namespace rdmabroker::proto
