// SPDX-License-Identifier: Apache-2.0
// The subject trie against a brute-force matcher (docs/subjects.md), with and
// without the per-worker match cache, plus removal and pruning.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "broker/subscription_budget.hpp"
#include "broker/subscription_index.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0, dot;
  while ((dot = s.find('.', start)) != std::string::npos) {
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
  out.push_back(s.substr(start));
  return out;
}

/// The definition, written as plainly as possible.
bool brute_match(const std::vector<std::string>& p, const std::vector<std::string>& s) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == ">") return s.size() > i;  // one or more remaining tokens
    if (i >= s.size()) return false;
    if (p[i] != "*" && p[i] != s[i]) return false;
  }
  return p.size() == s.size();
}

bool by_identity(const Subscriber& a, const Subscriber& b) {
  return std::tie(a.connection, a.sid) < std::tie(b.connection, b.sid);
}

TEST(SubscriptionIndex, WildcardSemantics) {
  SubscriptionIndex idx;
  idx.add("a.b", {0, 1, 1});
  idx.add("a.*", {0, 1, 2});
  idx.add("a.>", {0, 1, 3});
  idx.add("*.b", {0, 1, 4});
  idx.add(">", {0, 1, 5});
  std::vector<Subscriber> out;
  auto sids = [&](const char* subject) {
    idx.match(subject, out);
    std::vector<std::uint32_t> v;
    for (auto& s : out) v.push_back(s.sid);
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sids("a.b"), (std::vector<std::uint32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(sids("a.c"), (std::vector<std::uint32_t>{2, 3, 5}));
  EXPECT_EQ(sids("a.b.c"), (std::vector<std::uint32_t>{3, 5}));
  EXPECT_EQ(sids("a"), (std::vector<std::uint32_t>{5}));  // '>' needs at least one token after "a."
  EXPECT_EQ(sids("x.b"), (std::vector<std::uint32_t>{4, 5}));
}

TEST(SubscriptionIndex, RemoveIsExactAndPrunes) {
  SubscriptionIndex idx;
  idx.add("x.*", {0, 1, 1});
  const auto g = idx.generation();
  EXPECT_FALSE(idx.remove("x.*", {0, 1, 2}));
  EXPECT_FALSE(idx.remove("x.y", {0, 1, 1}));
  EXPECT_FALSE(idx.remove("x", {0, 1, 1}));
  EXPECT_EQ(idx.generation(), g);
  EXPECT_TRUE(idx.remove("x.*", {0, 1, 1}));
  EXPECT_GT(idx.generation(), g);
  std::vector<Subscriber> out{{9, 9, 9}};
  idx.match("x.y", out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(idx.size(), 0u);
  idx.add("x.*", {0, 1, 1});  // the pruned path can be built again
  idx.match("x.y", out);
  EXPECT_EQ(out.size(), 1u);
}

/// Everyone a Match names: plain subscribers and every queue group member.
std::vector<Subscriber> flatten(const Match& m) {
  std::vector<Subscriber> out = m.plain;
  for (const auto& g : m.groups) out.insert(out.end(), g.begin(), g.end());
  return out;
}

TEST(SubscriptionIndex, CacheSeesEveryChange) {
  SubscriptionIndex idx;
  MatchCache cache;
  EXPECT_TRUE(cache.match(idx, "a.b").empty());
  idx.add("a.*", {0, 1, 1});
  EXPECT_EQ(cache.match(idx, "a.b").plain.size(), 1u);
  EXPECT_EQ(cache.match(idx, "a.b").plain.size(), 1u);
  EXPECT_EQ(cache.hits(), 1u);
  idx.remove("a.*", {0, 1, 1});
  EXPECT_TRUE(cache.match(idx, "a.b").empty());
}

TEST(SubscriptionIndex, QueueGroupsAreOneNameAcrossPatterns) {
  SubscriptionIndex idx;
  const Subscriber a = idx.add("orders.*", {0, 1, 1}, "workers");
  const Subscriber b = idx.add("orders.new", {0, 2, 1}, "workers");
  const Subscriber c = idx.add("orders.>", {0, 3, 1}, "auditors");
  idx.add("orders.new", {0, 4, 1});
  EXPECT_NE(a.group, 0u);
  EXPECT_EQ(a.group, b.group);
  EXPECT_NE(a.group, c.group);
  Match m;
  idx.match("orders.new", m);
  ASSERT_EQ(m.plain.size(), 1u);
  EXPECT_EQ(m.plain[0].connection, 4u);
  ASSERT_EQ(m.groups.size(), 2u);
  EXPECT_EQ(m.fanout(), 3u);
  idx.match("orders.old", m);  // only one "workers" member matches this subject
  ASSERT_EQ(m.groups.size(), 2u);
  EXPECT_TRUE(m.plain.empty());
  // The name is released with its last member and a new group gets a new id.
  EXPECT_TRUE(idx.remove("orders.*", a));
  EXPECT_TRUE(idx.remove("orders.new", b));
  EXPECT_FALSE(idx.remove("orders.new", b));
  const Subscriber d = idx.add("orders.new", {0, 5, 1}, "workers");
  EXPECT_NE(d.group, a.group);
}

TEST(SubscriptionIndex, PickGoesRoundTheGroupEvenly) {
  SubscriptionIndex idx;
  for (std::uint64_t conn = 1; conn <= 4; ++conn) idx.add("jobs", {0, conn, 1}, "g");
  MatchCache cache;
  std::vector<int> got(5, 0);
  for (int i = 0; i < 10'000; ++i) {
    Match& m = cache.match(idx, "jobs");
    ASSERT_EQ(m.groups.size(), 1u);
    ++got[m.pick(0).connection];
  }
  for (std::uint64_t conn = 1; conn <= 4; ++conn) EXPECT_EQ(got[conn], 2500) << conn;
}

// 100,000 random subjects against random subscriptions (with '*' and '>'),
// checked against the brute-force definition, with and without the cache,
// while subscriptions come and go.
TEST(SubscriptionIndex, PropertyMatchesBruteForce) {
  std::mt19937 rng(20261122);
  const std::vector<std::string> vocab = {"a", "b", "c", "orders", "eu", "us", "1", "x_y"};
  auto token = [&] { return vocab[rng() % vocab.size()]; };
  auto subject = [&] {
    std::string s = token();
    for (int n = static_cast<int>(rng() % 4); n > 0; --n) s += "." + token();
    return s;
  };
  auto pattern = [&] {
    const int len = 1 + static_cast<int>(rng() % 4);
    std::string s;
    for (int i = 0; i < len; ++i) {
      if (i > 0) s += ".";
      const auto r = rng() % 10;
      if (r == 0 && i == len - 1)
        s += ">";
      else if (r < 3)
        s += "*";
      else
        s += token();
    }
    return s;
  };
  SubscriptionIndex idx;
  MatchCache cache(64);  // small: exercises the bound too
  struct Sub {
    std::string pattern;
    std::vector<std::string> tokens;
    Subscriber s;
  };
  std::vector<Sub> subs;
  std::uint32_t next_sid = 1;
  for (int i = 0; i < 300; ++i) {
    auto p = pattern();
    ASSERT_TRUE(proto::valid_pattern(p)) << p;
    // One in four joins one of two queue groups.
    const auto g = rng() % 8;
    Subscriber s = idx.add(p, {0, rng() % 20, next_sid++, 0}, g == 0 ? "g1" : g == 1 ? "g2" : "");
    subs.push_back({p, split(p), s});
  }
  std::vector<Subscriber> out;
  for (int i = 0; i < 100'000; ++i) {
    if (i % 1000 == 0) {  // churn
      const std::size_t k = rng() % subs.size();
      ASSERT_TRUE(idx.remove(subs[k].pattern, subs[k].s));
      subs.erase(subs.begin() + static_cast<long>(k));
      auto p = pattern();
      Subscriber s = idx.add(p, {0, rng() % 20, next_sid++, 0}, rng() % 4 == 0 ? "g1" : "");
      subs.push_back({p, split(p), s});
    }
    const std::string subj = subject();
    const auto subj_tokens = split(subj);
    std::vector<Subscriber> want;
    for (const auto& sub : subs) {
      if (brute_match(sub.tokens, subj_tokens)) want.push_back(sub.s);
    }
    std::sort(want.begin(), want.end(), by_identity);
    idx.match(subj, out);
    std::sort(out.begin(), out.end(), by_identity);
    ASSERT_EQ(out, want) << subj;
    const Match& m = cache.match(idx, subj);
    for (const auto& group : m.groups) {
      for (const auto& member : group) ASSERT_EQ(member.group, group.front().group) << subj;
    }
    auto cached = flatten(m);
    std::sort(cached.begin(), cached.end(), by_identity);
    ASSERT_EQ(cached, want) << subj << " (cached)";
  }
  EXPECT_GT(cache.hits(), 0u);
}

TEST(SubscriptionBudget, RefusesPastEitherBoundAndGivesBackExactly) {
  SubscriptionBudget b;
  const std::uint64_t c = SubscriptionBudget::cost("orders.eu", "");
  EXPECT_EQ(c, SubscriptionBudget::kFixedCost + 2 * SubscriptionBudget::kPerToken + 2 * 9);
  EXPECT_GT(SubscriptionBudget::cost("orders.eu", "workers"), c);  // the group name is held too
  EXPECT_EQ(b.take(c, 2, 10 * c), SubscriptionBudget::Refusal::kNone);
  EXPECT_EQ(b.take(c, 2, 10 * c), SubscriptionBudget::Refusal::kNone);
  EXPECT_EQ(b.take(c, 2, 10 * c), SubscriptionBudget::Refusal::kCount);
  EXPECT_EQ(b.count(), 2u);
  EXPECT_EQ(b.take(c, 100, 2 * c + c / 2), SubscriptionBudget::Refusal::kMemory);
  EXPECT_EQ(b.count(), 2u) << "a refusal by memory takes nothing";
  EXPECT_EQ(b.bytes(), 2 * c);
  b.give_back(c);
  b.give_back(c);
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(b.bytes(), 0u);
}

}  // namespace
}  // namespace rdmabroker::daemon
