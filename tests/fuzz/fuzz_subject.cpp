// SPDX-License-Identifier: Apache-2.0
// Subject parsing and matching on arbitrary text. The input is split at
// newlines into a pattern, a subject and a second pattern. Asserts: a valid
// subject is a valid pattern; the subscription trie (what routing uses) and
// pattern_matches (what permissions use) agree; covers and intersects are
// consistent with matching on the subject at hand.
#include <cstdint>
#include <string_view>
#include <vector>

#include "broker/subscription_index.hpp"
#include "fuzz_check.hpp"
#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace proto = rdmabroker::proto;
using rdmabroker::daemon::Subscriber;
using rdmabroker::daemon::SubscriptionIndex;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string_view parts[3];
  for (auto& part : parts) {
    const auto nl = text.find('\n');
    part = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  }
  const auto [p, s, q] = parts;
  for (auto part : parts) {
    if (proto::valid_subject(part)) FUZZ_CHECK(proto::valid_pattern(part));
  }
  if (!proto::valid_pattern(p)) return 0;

  SubscriptionIndex index;
  const Subscriber stored = index.add(p, Subscriber{0, 1, 1, 0, 0});
  if (proto::valid_subject(s)) {
    std::vector<Subscriber> out;
    index.match(s, out);
    FUZZ_CHECK(out.empty() != proto::pattern_matches(p, s));
  }
  FUZZ_CHECK(proto::pattern_covers(p, p) && proto::patterns_intersect(p, p));
  if (proto::valid_pattern(q)) {
    FUZZ_CHECK(proto::patterns_intersect(p, q) == proto::patterns_intersect(q, p));
    if (proto::pattern_covers(p, q)) FUZZ_CHECK(proto::patterns_intersect(p, q));
    if (proto::valid_subject(s)) {
      const bool in_p = proto::pattern_matches(p, s), in_q = proto::pattern_matches(q, s);
      if (proto::pattern_covers(p, q) && in_q) FUZZ_CHECK(in_p);
      if (in_p && in_q) FUZZ_CHECK(proto::patterns_intersect(p, q));
    }
    index.add(q, Subscriber{0, 2, 2, 0, 0}, "g");
  }
  FUZZ_CHECK(index.remove(p, stored));
  return 0;
}
