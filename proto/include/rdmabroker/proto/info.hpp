// SPDX-License-Identifier: Apache-2.0
// INFO (SPEC.md §8, "Gossip", version 7): what a broker of a cluster tells
// its clients and the routes logged in to it about itself and the brokers it
// has routes up to, and the route login's announcement of the dialing
// broker's own route URLs. Text, one "key value" per line, so that a later
// version can add keys an older reader skips. Header-only.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdmabroker::proto {

/// One broker as INFO describes it.
struct BrokerInfo {
  std::string id;                   // 16 hex digits, random at each start (§8)
  std::vector<std::string> urls;    // where clients reach it
  std::vector<std::string> routes;  // where other brokers' routes reach it
  bool operator==(const BrokerInfo&) const = default;
};

/// An INFO frame's payload.
struct Info {
  BrokerInfo self;
  std::string cluster;
  std::vector<BrokerInfo> peers;  // the brokers the sender has a route up to
  bool operator==(const Info&) const = default;
};

namespace detail {
inline bool info_word(std::string_view s) {
  if (s.empty()) return false;
  for (const char ch : s)
    if (ch <= ' ' || ch > '~') return false;
  return true;
}
}  // namespace detail

/// The payload for `info`, at most `max_len` bytes: the sender's URLs that
/// do not fit are left out one by one, then whole peers (a client with 1 KiB
/// buffers still learns the sender and what fits of the rest). Empty when
/// not even the id and cluster fit.
inline std::string encode_info(const Info& info, std::size_t max_len) {
  std::string out = "id " + info.self.id + "\n";
  if (!info.cluster.empty()) out += "cluster " + info.cluster + "\n";
  if (out.size() > max_len) return {};
  const auto add = [&](std::string_view key, const std::string& value) {
    if (out.size() + key.size() + value.size() + 2 <= max_len)
      out.append(key).append(" ").append(value) += '\n';
  };
  for (const auto& u : info.self.urls) add("url", u);
  for (const auto& r : info.self.routes) add("route", r);
  for (const auto& p : info.peers) {
    std::string lines;
    for (const auto& u : p.urls) lines += "peer_url " + p.id + " " + u + "\n";
    for (const auto& r : p.routes) lines += "peer_route " + p.id + " " + r + "\n";
    if (lines.empty()) lines = "peer " + p.id + "\n";
    if (out.size() + lines.size() > max_len) continue;
    out += lines;
  }
  return out;
}

/// Reads an INFO payload: lines of "key value" (one space, printable ASCII,
/// each line ended by '\n'); keys it does not know are skipped. nullopt
/// (with `why`) when a line breaks that form, a known key's value is
/// malformed, or `id` is missing or repeated.
inline std::optional<Info> decode_info(std::string_view text, std::string* why = nullptr) {
  const auto fail = [&](std::string reason) -> std::optional<Info> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  Info info;
  auto peer = [&](std::string_view id) -> BrokerInfo& {
    for (auto& p : info.peers)
      if (p.id == id) return p;
    info.peers.push_back({std::string(id), {}, {}});
    return info.peers.back();
  };
  bool has_id = false;
  while (!text.empty()) {
    const auto end = text.find('\n');
    if (end == std::string_view::npos) return fail("a line without its '\\n'");
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end + 1);
    const auto space = line.find(' ');
    if (space == std::string_view::npos) return fail("a line without a value: '" + std::string(line) + "'");
    const std::string_view key = line.substr(0, space);
    const std::string_view value = line.substr(space + 1);
    if (!detail::info_word(key)) return fail("a line without a key");
    if (key == "id") {
      if (has_id || !detail::info_word(value)) return fail("'id' missing a value or given twice");
      info.self.id = std::string(value);
      has_id = true;
    } else if (key == "cluster" || key == "url" || key == "route") {
      if (!detail::info_word(value)) return fail("'" + std::string(key) + "' without a single value");
      if (key == "cluster")
        info.cluster = std::string(value);
      else
        (key == "url" ? info.self.urls : info.self.routes).emplace_back(value);
    } else if (key == "peer" || key == "peer_url" || key == "peer_route") {
      const auto gap = value.find(' ');
      const std::string_view id = value.substr(0, gap);
      const std::string_view url = gap == std::string_view::npos ? std::string_view() : value.substr(gap + 1);
      if (!detail::info_word(id) || (key == "peer") != url.empty() ||
          (!url.empty() && !detail::info_word(url)))
        return fail("'" + std::string(key) + "' needs a broker id" + (key == "peer" ? "" : " and a URL"));
      BrokerInfo& p = peer(id);
      if (key != "peer") (key == "peer_url" ? p.urls : p.routes).emplace_back(url);
    }
    // Any other key: a later version's, skipped.
  }
  if (!has_id) return fail("no 'id' line");
  return info;
}

/// A broker id (§8): 16 hex digits.
inline bool valid_broker_id(std::string_view id) {
  return id.size() == 16 && std::all_of(id.begin(), id.end(), [](char ch) {
           return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
         });
}

/// A route login's second string (§8): the dialing broker's id, then, from
/// version 7, its own route URLs, each after a comma (a broker URL has none,
/// and the string follows the subject rules of §3.2, which allow no space).
inline std::string route_login_name(std::string_view id, const std::vector<std::string>& routes) {
  std::string out(id);
  for (const auto& r : routes) out += "," + r;
  return out;
}

/// Splits a route login's second string into the id and the route URLs; an
/// empty id when it is malformed (an empty word, a character outside
/// printable ASCII).
inline BrokerInfo split_route_login(std::string_view s) {
  BrokerInfo out;
  std::size_t words = 0;
  while (true) {
    const auto gap = s.find(',');
    const std::string_view word = s.substr(0, gap);
    if (!detail::info_word(word)) return {};
    (words++ == 0 ? out.id : out.routes.emplace_back()) = std::string(word);
    if (gap == std::string_view::npos) return out;
    s.remove_prefix(gap + 1);
  }
}

}  // namespace rdmabroker::proto
