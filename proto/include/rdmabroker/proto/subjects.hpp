// SPDX-License-Identifier: Apache-2.0
// Relations between subjects and subject patterns (SPEC.md "Subjects",
// docs/subjects.md), token by token, for code that holds a handful of patterns
// rather than an index: permissions (which publishes and subscriptions a user
// may make) and tests. Routing uses the subscription trie instead.
//
// Every function expects syntactically valid input (valid_subject /
// valid_pattern); a subject is a pattern without wildcards.
#pragma once
#include <string_view>

namespace rdmabroker::proto {

/// Subjects under this prefix are the broker's own (advisories; SPEC.md
/// §3.2): only a broker publishes there, and a stream may not take them.
inline constexpr std::string_view kReservedPrefix = "$RB.";

/// A stream's or a durable consumer's name (SPEC.md §3.11): 1 to 64 ASCII
/// letters, digits, '-' and '_' (a file name, and one subject token).
inline bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace detail {
/// Splits off the first token of `rest` (which becomes what follows the dot).
/// Returns false when `rest` was already empty.
inline bool next_token(std::string_view& rest, std::string_view& token, bool& more) {
  if (!more) return false;
  const auto dot = rest.find('.');
  if (dot == std::string_view::npos) {
    token = rest;
    rest = {};
    more = false;
  } else {
    token = rest.substr(0, dot);
    rest.remove_prefix(dot + 1);
  }
  return true;
}
}  // namespace detail

/// Whether the wildcard-free `subject` matches `pattern`: '*' is any one
/// token, a final '>' one or more tokens.
inline bool pattern_matches(std::string_view pattern, std::string_view subject) {
  std::string_view p, s;
  bool p_more = true, s_more = true;
  while (detail::next_token(pattern, p, p_more)) {
    if (p == ">") return detail::next_token(subject, s, s_more);  // at least one token left
    if (!detail::next_token(subject, s, s_more)) return false;
    if (p != "*" && p != s) return false;
  }
  return !s_more;
}

/// Whether every subject matching `inner` also matches `outer` (so a
/// permission on `outer` grants a subscription to `inner`). A subject covers
/// only itself; '>' covers every pattern of at least as many tokens.
inline bool pattern_covers(std::string_view outer, std::string_view inner) {
  std::string_view o, i;
  bool o_more = true, i_more = true;
  while (detail::next_token(outer, o, o_more)) {
    if (o == ">") return detail::next_token(inner, i, i_more);
    if (!detail::next_token(inner, i, i_more)) return false;
    if (i == ">") return false;  // inner reaches subjects longer than outer's fixed tokens
    if (o == "*") continue;      // covers a literal or '*'
    if (i != o) return false;    // a literal covers only itself
  }
  return !i_more;
}

/// Whether some subject matches both patterns (a subscription to `a` can see
/// a message that `b` is about).
inline bool patterns_intersect(std::string_view a, std::string_view b) {
  std::string_view x, y;
  bool a_more = true, b_more = true;
  while (true) {
    const bool has_x = detail::next_token(a, x, a_more);
    const bool has_y = detail::next_token(b, y, b_more);
    if (!has_x || !has_y) return has_x == has_y;
    if (x == ">" || y == ">") return true;  // the other has a token here; '>' takes it and any rest
    if (x != "*" && y != "*" && x != y) return false;
  }
}

}  // namespace rdmabroker::proto
