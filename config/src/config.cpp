// SPDX-License-Identifier: Apache-2.0
// The schema is one table (kFields): each setting's YAML key, whether it may
// change live, how it is parsed and validated, and how it prints. Parsing,
// unknown-key detection and diff() all walk that table, so a setting cannot
// be parsed but forgotten by reload, or the other way round.
#include "rdmabroker/config/config.hpp"
#include "rdmabroker/common/url.hpp"

#include <arpa/inet.h>
#include <crypt.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "rdmabroker/proto/info.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "rules.hpp"
#include "structured.hpp"

namespace rdmabroker::config {

namespace {

using namespace structured;

using Setter =
    std::function<std::optional<std::string>(const YAML::Node&, Config&)>;  // error text or nothing
using Shower = std::function<std::string(const Config&)>;
using Copier = std::function<void(const Config& from, Config& to)>;

struct Field {
  std::string_view section;  // "" for a top-level key
  std::string_view name;
  bool live;
  Setter set;
  Shower show;
  Copier copy;  // what copy_live() takes of a live field (every live field has one: unit-tested)
  std::string key() const {
    return section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
  }
};

/// An unsigned setting reached through `get` (sizes with `size`).
template <typename T>
Field uint_field(std::string_view section, std::string_view name, bool live, std::function<T&(Config&)> get,
                 std::uint64_t lo, std::uint64_t hi, bool size = false) {
  return Field{section,
               name,
               live,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 std::uint64_t v = 0;
                 if (auto e = parse_uint(n, lo, hi, size, v)) return e;
                 get(c) = static_cast<T>(v);
                 return std::nullopt;
               },
               [=](const Config& c) { return std::to_string(get(const_cast<Config&>(c))); },
               [=](const Config& from, Config& to) { get(to) = get(const_cast<Config&>(from)); }};
}

/// An unsigned member of BrokerOptions.
template <typename T>
Field uint_field(std::string_view section, std::string_view name, bool live, T BrokerOptions::*member,
                 std::uint64_t lo, std::uint64_t hi, bool size = false) {
  return uint_field<T>(
      section, name, live, [member](Config& c) -> T& { return c.broker.*member; }, lo, hi, size);
}

template <typename E>
Field enum_field(std::string_view section, std::string_view name, bool live, std::function<E&(Config&)> get,
                 std::vector<std::pair<std::string_view, E>> values) {
  return Field{section,
               name,
               live,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 std::string text;
                 if (auto e = scalar_text(n, text)) return e;
                 std::string allowed;
                 for (const auto& [k, v] : values) {
                   if (k == text) {
                     get(c) = v;
                     return std::nullopt;
                   }
                   allowed += (allowed.empty() ? "" : ", ") + std::string(k);
                 }
                 return "expected one of " + allowed + ", got '" + text + "'";
               },
               [=](const Config& c) {
                 for (const auto& [k, v] : values) {
                   if (get(const_cast<Config&>(c)) == v) return std::string(k);
                 }
                 return std::string("?");
               },
               [=](const Config& from, Config& to) { get(to) = get(const_cast<Config&>(from)); }};
}

/// "host:port", or (when `optional`) "" to turn the listener off.
Field listener_field(std::string_view section, std::string_view name, bool optional,
                     std::function<std::string&(Config&)> host, std::function<std::uint16_t&(Config&)> port) {
  return Field{section, name, false,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 std::string text;
                 if (auto e = scalar_text(n, text)) return e;
                 if (text.empty() && optional) {
                   port(c) = 0;
                   return std::nullopt;
                 }
                 auto hp = parse_host_port(text, "address");
                 if (!hp) return hp.error().message;
                 host(c) = hp->host;
                 port(c) = hp->port;
                 return std::nullopt;
               },
               [=](const Config& c) {
                 auto& cc = const_cast<Config&>(c);
                 // An empty TCP host follows listen.rdma's: show the address that is listened on.
                 const std::string& h = host(cc).empty() ? cc.broker.listen_address : host(cc);
                 return port(cc) == 0 ? std::string() : h + ":" + std::to_string(port(cc));
               }};
}

Field string_field(std::string_view section, std::string_view name, bool live,
                   std::function<std::string&(Config&)> get) {
  return Field{section,
               name,
               live,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 std::string text;
                 if (auto e = scalar_text(n, text)) return e;
                 get(c) = text;
                 return std::nullopt;
               },
               [=](const Config& c) { return get(const_cast<Config&>(c)); },
               [=](const Config& from, Config& to) { get(to) = get(const_cast<Config&>(from)); }};
}

Field bool_field(std::string_view section, std::string_view name, bool live,
                 std::function<bool&(Config&)> get) {
  return Field{section,
               name,
               live,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 if (!parse_bool(n, get(c))) return "expected true or false";
                 return std::nullopt;
               },
               [=](const Config& c) { return std::string(get(const_cast<Config&>(c)) ? "true" : "false"); },
               [=](const Config& from, Config& to) { get(to) = get(const_cast<Config&>(from)); }};
}

/// "239.77.0.0/16": an IPv4 multicast range (224.0.0.0/4) with room for groups.
std::optional<std::string> check_group_range(const std::string& text) {
  const auto slash = text.find('/');
  in_addr a{};
  unsigned bits = 0;
  const char* end = text.data() + text.size();
  if (slash == std::string::npos || inet_pton(AF_INET, text.substr(0, slash).c_str(), &a) != 1 ||
      std::from_chars(text.data() + slash + 1, end, bits).ptr != end || bits < 4 || bits > 30) {
    return "expected an IPv4 multicast range such as 239.77.0.0/16 (prefix 4..30), got '" + text + "'";
  }
  if ((ntohl(a.s_addr) >> 28) != 0xe) return "'" + text + "' is not in the multicast range 224.0.0.0/4";
  return std::nullopt;
}

/// A list of cluster URLs (cluster.routes, cluster.advertise, cluster.client_advertise).
Field url_list_field(std::string_view name, bool live, bool for_routes,
                     std::function<std::vector<std::string>&(Config&)> get) {
  return Field{"cluster",
               name,
               live,
               [=](const YAML::Node& n, Config& c) -> std::optional<std::string> {
                 if (!n.IsSequence())
                   return "expected a list of broker URLs, e.g. [rdma://broker-b:7470, tcp://broker-c:7471]";
                 get(c).clear();
                 for (const auto& r : n) {
                   if (!r.IsScalar()) return "expected broker URLs";
                   if (auto e = check_cluster_url(r.Scalar(), for_routes)) return e;
                   get(c).push_back(r.Scalar());
                 }
                 return std::nullopt;
               },
               [=](const Config& c) {
                 std::string s = "[";
                 for (const auto& r : get(const_cast<Config&>(c))) s += (s.size() > 1 ? ", " : "") + r;
                 return s + "]";
               },
               [=](const Config& from, Config& to) { get(to) = get(const_cast<Config&>(from)); }};
}

/// A cluster's name travels as a route's CONNECT subject (SPEC.md §8).

const std::vector<Field>& fields() {
  using B = BrokerOptions;
  static const std::vector<Field> kFields = {
      listener_field(
          "listen", "rdma", false, [](Config& c) -> std::string& { return c.broker.listen_address; },
          [](Config& c) -> std::uint16_t& { return c.broker.port; }),
      listener_field(
          "listen", "tcp", true, [](Config& c) -> std::string& { return c.broker.tcp_listen_address; },
          [](Config& c) -> std::uint16_t& { return c.broker.tcp_port; }),
      enum_field<RdmaMode>("", "rdma", false, [](Config& c) -> RdmaMode& { return c.broker.rdma; },
                           {{"auto", RdmaMode::kAuto}, {"on", RdmaMode::kOn}, {"off", RdmaMode::kOff}}),
      Field{"", "devices", false,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              if (!n.IsSequence()) return "expected a list of RDMA device names, e.g. [mlx5_0] (empty: all)";
              c.broker.devices.clear();
              for (const auto& d : n) {
                if (!d.IsScalar() || d.Scalar().empty()) return "expected device names";
                c.broker.devices.push_back(d.Scalar());
              }
              return std::nullopt;
            },
            [](const Config& c) {
              std::string s = "[";
              for (const auto& d : c.broker.devices) s += (s.size() > 1 ? ", " : "") + d;
              return s + "]";
            }},
      uint_field("", "workers", false, &B::workers, 0, 64),
      uint_field("buffers", "size", false, &B::buffer_size, 1024, 16u << 20, true),
      uint_field("buffers", "pool", false, &B::pool_buffers, 16, 1u << 20),
      uint_field("buffers", "srq_depth", false, &B::srq_depth, 16, 1u << 16),
      // At least 4: with a window of 2 or 3, half the window is one credit,
      // and two peers answer each other's pure credit updates for ever
      // (tests/unit/credits_test.cpp, IdlePeersStopExchangingCreditUpdates).
      uint_field("flow", "credits", false, &B::credits, 4, 65535),
      uint_field("flow", "max_inflight_sends", false, &B::max_inflight_sends, 1, 1024),
      uint_field("flow", "busy_poll_us", true, &B::busy_poll_us, 0, 1'000'000),
      bool_field("flow", "adaptive_poll", true, [](Config& c) -> bool& { return c.broker.adaptive_poll; }),
      uint_field("limits", "max_connections", false, &B::max_connections, 1, 1u << 20),
      uint_field("limits", "max_unauthenticated", true, &B::max_unauthenticated, 0, 1u << 20),
      uint_field("limits", "max_unauthenticated_per_address", true, &B::max_unauthenticated_per_address, 1,
                 1u << 20),
      uint_field("limits", "frame_timeout_ms", true, &B::frame_timeout_ms, 100, 3'600'000),
      uint_field("limits", "fragment_timeout_ms", true, &B::fragment_timeout_ms, 100, 3'600'000),
      uint_field("limits", "max_payload", true, &B::max_payload, 0, 64u << 20, true),
      uint_field("limits", "rendezvous_min", true, &B::rendezvous_min, 0, 64u << 20, true),
      uint_field("limits", "max_subscriptions", true, &B::max_subscriptions, 1, 10'000'000),
      uint_field("limits", "max_pending_bytes", true, &B::max_pending_bytes, 4096, 1ull << 40, true),
      uint_field("limits", "max_subscriptions_total", true, &B::max_subscriptions_total, 1, 100'000'000),
      uint_field("limits", "max_subscription_memory", true, &B::max_subscription_memory, 64u << 10,
                 1ull << 40, true),
      uint_field("limits", "user_subscription_share_percent", true, &B::user_subscription_share_percent, 1,
                 100),
      uint_field("limits", "max_consumers_per_stream", false, &B::max_consumers_per_stream, 1, 1'000'000),
      uint_field("limits", "max_durables_per_user", false, &B::max_durables_per_user, 1, 1'000'000),
      uint_field("limits", "max_consumers_total", false, &B::max_consumers_total, 1, 10'000'000),
      uint_field("limits", "consumer_opens_per_second", true, &B::consumer_opens_per_second, 1, 1'000'000),
      uint_field("limits", "consumer_inactive_threshold_s", false, &B::consumer_inactive_threshold_s, 0,
                 365 * 86400),
      uint_field("limits", "max_pending_bytes_total", true, &B::max_pending_bytes_total, 64u << 10,
                 1ull << 44, true),
      uint_field("limits", "pool_share_percent", true, &B::pool_share_percent, 1, 50),
      uint_field("limits", "user_pool_share_percent", true, &B::user_pool_share_percent, 1, 50),
      uint_field("slow_consumer", "write_deadline_ms", true, &B::write_deadline_ms, 10, 3'600'000),
      uint_field("slow_consumer", "producer_stall_ms", true, &B::producer_stall_ms, 0, 60'000),
      uint_field("slow_consumer", "drain_timeout_ms", true, &B::drain_timeout_ms, 100, 60'000),
      Field{"auth", "anonymous", true,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              if (!parse_bool(n, c.broker.auth.anonymous)) return "expected true or false";
              return std::nullopt;
            },
            [](const Config& c) { return std::string(c.broker.auth.anonymous ? "true" : "false"); },
            [](const Config& from, Config& to) { to.broker.auth.anonymous = from.broker.auth.anonymous; }},
      Field{"auth", "anonymous_permissions", true,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              if (!n.IsMap()) return "expected a mapping with publish, subscribe and/or streams rules";
              only_keys(n, "", {"publish", "subscribe", "streams"});
              parse_permissions(n, "", c.broker.auth.anonymous_permissions);
              return std::nullopt;
            },
            [](const Config& c) { return show_permissions(c.broker.auth.anonymous_permissions); },
            [](const Config& from, Config& to) {
              to.broker.auth.anonymous_permissions = from.broker.auth.anonymous_permissions;
            }},
      Field{"auth", "users", true, parse_users,
            [](const Config& c) { return show_users(c.broker.auth.users); },
            [](const Config& from, Config& to) { to.broker.auth.users = from.broker.auth.users; }},
      uint_field<std::uint32_t>(
          "auth", "timeout_ms", true, [](Config& c) -> std::uint32_t& { return c.broker.auth.timeout_ms; },
          100, 600'000),
      uint_field<std::uint32_t>(
          "auth", "failure_delay_ms", true,
          [](Config& c) -> std::uint32_t& { return c.broker.auth.failure_delay_ms; }, 0, 600'000),
      uint_field<std::uint32_t>(
          "auth", "failure_delay_max_ms", true,
          [](Config& c) -> std::uint32_t& { return c.broker.auth.failure_delay_max_ms; }, 0, 3'600'000),
      uint_field<std::uint32_t>(
          "auth", "cache_ttl_s", true, [](Config& c) -> std::uint32_t& { return c.broker.auth.cache_ttl_s; },
          0, 86'400),
      bool_field("multicast", "enabled", false,
                 [](Config& c) -> bool& { return c.broker.multicast.enabled; }),
      Field{"multicast", "groups", false,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              std::string text;
              if (auto e = scalar_text(n, text)) return e;
              if (auto e = check_group_range(text)) return e;
              c.broker.multicast.groups = text;
              return std::nullopt;
            },
            [](const Config& c) { return c.broker.multicast.groups; }},
      Field{"multicast", "subjects", true,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              parse_patterns(n, "", c.broker.multicast.subjects);
              return std::nullopt;
            },
            [](const Config& c) {
              std::string s = "[";
              for (const auto& p : c.broker.multicast.subjects) s += (s.size() > 1 ? ", " : "") + p;
              return s + "]";
            },
            [](const Config& from, Config& to) {
              to.broker.multicast.subjects = from.broker.multicast.subjects;
            }},
      uint_field<std::uint32_t>(
          "multicast", "threshold", true,
          [](Config& c) -> std::uint32_t& { return c.broker.multicast.threshold; }, 1, 1u << 20),
      uint_field<std::uint32_t>(
          "multicast", "leave_below", true,
          [](Config& c) -> std::uint32_t& { return c.broker.multicast.leave_below; }, 1, 1u << 20),
      uint_field<std::uint32_t>(
          "multicast", "retransmit_window", false,
          [](Config& c) -> std::uint32_t& { return c.broker.multicast.retransmit_window; }, 16, 1u << 20),
      string_field("storage", "directory", false,
                   [](Config& c) -> std::string& { return c.broker.storage.directory; }),
      enum_field<StreamSync>("storage", "sync", true,
                             [](Config& c) -> StreamSync& { return c.broker.storage.sync; },
                             {{"group", StreamSync::kGroup},
                              {"always", StreamSync::kAlways},
                              {"interval", StreamSync::kInterval}}),
      uint_field<std::uint32_t>(
          "storage", "sync_interval_ms", true,
          [](Config& c) -> std::uint32_t& { return c.broker.storage.sync_interval_ms; }, 1, 60'000),
      Field{"", "streams", true, parse_streams,
            [](const Config& c) { return show_streams(c.broker.streams); },
            [](const Config& from, Config& to) { to.broker.streams = from.broker.streams; }},
      string_field("cluster", "name", false, [](Config& c) -> std::string& { return c.broker.cluster.name; }),
      url_list_field("routes", true, true,
                     [](Config& c) -> std::vector<std::string>& { return c.broker.cluster.routes; }),
      url_list_field("advertise", true, true,
                     [](Config& c) -> std::vector<std::string>& { return c.broker.cluster.advertise; }),
      url_list_field(
          "client_advertise", true, false,
          [](Config& c) -> std::vector<std::string>& { return c.broker.cluster.client_advertise; }),
      string_field("cluster", "user", false, [](Config& c) -> std::string& { return c.broker.cluster.user; }),
      Field{"cluster", "password", false,
            [](const YAML::Node& n, Config& c) -> std::optional<std::string> {
              return scalar_text(n, c.broker.cluster.password);
            },
            // Never shown (the effective configuration is printed and logged).
            [](const Config& c) { return std::string(c.broker.cluster.password.empty() ? "" : "(set)"); }},
      listener_field(
          "cluster", "listen_rdma", true,
          [](Config& c) -> std::string& { return c.broker.cluster.listen_rdma_address; },
          [](Config& c) -> std::uint16_t& { return c.broker.cluster.listen_rdma_port; }),
      listener_field(
          "cluster", "listen_tcp", true,
          [](Config& c) -> std::string& { return c.broker.cluster.listen_tcp_address; },
          [](Config& c) -> std::uint16_t& { return c.broker.cluster.listen_tcp_port; }),
      string_field("metrics", "listen", false, [](Config& c) -> std::string& { return c.metrics_listen; }),
      string_field("admin", "socket", false, [](Config& c) -> std::string& { return c.broker.admin_socket; }),
      enum_field<std::string>("logging", "level", true, [](Config& c) -> std::string& { return c.log.level; },
                              {{"trace", "trace"},
                               {"debug", "debug"},
                               {"info", "info"},
                               {"warn", "warn"},
                               {"error", "error"},
                               {"critical", "critical"},
                               {"off", "off"}}),
      enum_field<TlsMode>(
          "tls", "mode", true, [](Config& c) -> TlsMode& { return c.broker.tls.mode; },
          {{"off", TlsMode::kOff}, {"optional", TlsMode::kOptional}, {"required", TlsMode::kRequired}}),
      string_field("tls", "certificate", true,
                   [](Config& c) -> std::string& { return c.broker.tls.certificate; }),
      string_field("tls", "key", true, [](Config& c) -> std::string& { return c.broker.tls.key; }),
      string_field("tls", "client_ca", true,
                   [](Config& c) -> std::string& { return c.broker.tls.client_ca; }),
      enum_field<std::string>("tls", "min_version", true,
                              [](Config& c) -> std::string& { return c.broker.tls.min_version; },
                              {{"1.2", "1.2"}, {"1.3", "1.3"}}),
      enum_field<LogFormat>("logging", "format", true, [](Config& c) -> LogFormat& { return c.log.format; },
                            {{"text", LogFormat::kText}, {"json", LogFormat::kJson}}),
      enum_field<LogTarget>(
          "logging", "target", false, [](Config& c) -> LogTarget& { return c.log.target; },
          {{"auto", LogTarget::kAuto}, {"console", LogTarget::kConsole}, {"journald", LogTarget::kJournald}}),
  };
  return kFields;
}

class Problems {
 public:
  explicit Problems(std::string file) : file_(std::move(file)) {}
  void add(const YAML::Mark& m, const std::string& key, const std::string& msg) {
    std::string where = file_;
    if (!m.is_null()) where += ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
    lines_ += (lines_.empty() ? "" : "\n") + where + ": " + (key.empty() ? "" : key + ": ") + msg;
  }
  bool empty() const { return lines_.empty(); }
  Error error() const { return Error{ErrorKind::kInvalidArgument, lines_}; }

 private:
  std::string file_;
  std::string lines_;
};

}  // namespace

std::string_view to_string(RdmaMode m) {
  return m == RdmaMode::kAuto ? "auto" : m == RdmaMode::kOn ? "on" : "off";
}
std::string_view to_string(TlsMode m) {
  return m == TlsMode::kOff ? "off" : m == TlsMode::kOptional ? "optional" : "required";
}
std::string_view to_string(LogFormat f) { return f == LogFormat::kText ? "text" : "json"; }
std::string_view to_string(LogTarget t) {
  return t == LogTarget::kAuto ? "auto" : t == LogTarget::kConsole ? "console" : "journald";
}

/// The rules that tie settings together: each broken one is reported with
/// the key that breaks it. parse() and validate() (flags applied) share them.
Result<Config> parse(std::string_view yaml, const std::string& name) {
  Problems problems(name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::ParserException& e) {
    problems.add(e.mark, "", "YAML syntax: " + e.msg);
    return problems.error();
  }
  Config c;
  if (root.IsNull()) return c;  // an empty file: every default
  if (!root.IsMap()) {
    problems.add(root.Mark(), "", "expected a mapping of settings at the top level");
    return problems.error();
  }
  const auto& table = fields();
  auto find = [&](std::string_view section, std::string_view key) -> const Field* {
    for (const auto& f : table) {
      if (f.section == section && f.name == key) return &f;
    }
    return nullptr;
  };
  auto is_section = [&](std::string_view s) {
    for (const auto& f : table) {
      if (!f.section.empty() && f.section == s) return true;
    }
    return false;
  };
  auto apply = [&](const Field& f, const YAML::Node& value) {
    c.file_keys.insert(f.key());
    try {
      if (auto err = f.set(value, c)) problems.add(value.Mark(), f.key(), *err);
    } catch (const YAML::Exception& e) {
      problems.add(value.Mark(), f.key(), e.msg);
    } catch (const FieldProblem& p) {
      problems.add(p.mark, f.key() + p.key_suffix, p.message);
    }
  };
  for (const auto& top : root) {
    const std::string key = top.first.Scalar();
    if (is_section(key)) {
      if (!top.second.IsMap()) {
        problems.add(top.second.Mark(), key, "expected a mapping (a section of settings)");
        continue;
      }
      for (const auto& sub : top.second) {
        const std::string name = sub.first.Scalar();
        if (const Field* f = find(key, name)) {
          apply(*f, sub.second);
        } else {
          problems.add(sub.first.Mark(), key + "." + name, "unknown key");
        }
      }
    } else if (const Field* f = find("", key)) {
      apply(*f, top.second);
    } else {
      problems.add(top.first.Mark(), key, "unknown key");
    }
  }
  // Rules that tie settings together, reported at the key that breaks them.
  auto mark_of = [&](std::string_view key) {
    const auto dot = key.find('.');
    const std::string section(dot == std::string_view::npos ? "" : key.substr(0, dot));
    const std::string name(dot == std::string_view::npos ? key : key.substr(dot + 1));
    const YAML::Node s = section.empty() ? root : root[section];
    if (s && s.IsMap() && s[name]) return s[name].Mark();
    return YAML::Mark::null_mark();
  };
  check_rules(c, [&](std::string_view key, const std::string& message) {
    problems.add(mark_of(key), std::string(key), message);
  });
  if (!problems.empty()) return problems.error();
  return c;
}

Result<Config> load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error{ErrorKind::kInvalidArgument, path + ": cannot read: " + std::strerror(errno)};
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

std::optional<std::string> show(const Config& c, std::string_view key) {
  for (const auto& f : fields()) {
    if (f.key() == key) return f.show(c);
  }
  return std::nullopt;
}

Status validate(const Config& c) {
  std::string problems;
  check_rules(c, [&](std::string_view key, const std::string& message) {
    problems += (problems.empty() ? "" : "\n") + std::string(key) + ": " + message;
  });
  if (!problems.empty()) return Error{ErrorKind::kInvalidArgument, problems};
  return {};
}

std::optional<std::string> set(Config& c, std::string_view key, const std::string& value) {
  for (const auto& f : fields()) {
    if (f.key() != key) continue;
    try {
      return f.set(YAML::Node(value), c);
    } catch (const FieldProblem& p) {
      return p.message;
    }
  }
  return "no setting " + std::string(key);
}

void copy_live(const Config& next, Config& running) {
  for (const auto& f : fields()) {
    if (f.live) f.copy(next, running);
  }
}

void copy_live(const BrokerOptions& next, BrokerOptions& running) {
  Config from, to;
  from.broker = next;
  to.broker = std::move(running);
  copy_live(from, to);
  running = std::move(to.broker);
}

std::vector<std::string> live_keys_without_copy() {
  std::vector<std::string> out;
  for (const auto& f : fields()) {
    if (f.live && !f.copy) out.push_back(f.key());
  }
  return out;
}

std::vector<Change> diff(const Config& running, const Config& next) {
  std::vector<Change> out;
  for (const auto& f : fields()) {
    std::string a = f.show(running), b = f.show(next);
    if (a != b) out.push_back(Change{f.key(), std::move(a), std::move(b), f.live});
  }
  return out;
}

}  // namespace rdmabroker::config
