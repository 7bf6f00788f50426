// SPDX-License-Identifier: Apache-2.0
// Loading, validating and comparing the broker's YAML configuration
// (docs/configuration.md). Every problem is reported, not just the first, each
// naming the file, line, column and key; a file with any problem yields no
// Config at all, so a bad reload can never half-apply.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::config {

inline constexpr const char* kDefaultConfigPath = "/etc/rdmabroker/broker.yaml";

/// Parses YAML text; `name` is what messages call the file.
Result<Config> parse(std::string_view yaml, const std::string& name);
/// Reads and parses a file. A missing file is an error here: whether a
/// missing default file is acceptable is the caller's decision.
Result<Config> load(const std::string& path);

/// The rules that tie settings together (also checked by parse()): for a
/// config that command-line flags changed after it was read.
Status validate(const Config& c);

/// Sets one setting from text, as its YAML value would ("8KiB", "on"):
/// nothing, or what is wrong with the value (its range, its form).
std::optional<std::string> set(Config& c, std::string_view key, const std::string& value);

/// One setting that differs between two configs.
struct Change {
  std::string key;   // dotted YAML path, e.g. "limits.max_subscriptions"
  std::string from;  // values as text, for logs and replies
  std::string to;
  bool live = false;  // may change while the broker runs
};

/// What changed from `running` to `next`, in YAML key order.
std::vector<Change> diff(const Config& running, const Config& next);

/// Takes the live settings (Change::live) of `next` into `running`, and
/// nothing else: what a reload applies to a running broker.
void copy_live(const Config& next, Config& running);
void copy_live(const BrokerOptions& next, BrokerOptions& running);
/// Live settings that copy_live() would pass over (a unit test keeps it empty).
std::vector<std::string> live_keys_without_copy();

/// A setting's value as diff() and the logs print it ("listen.tcp" ->
/// "0.0.0.0:7471"); empty when no setting has that key.
std::optional<std::string> show(const Config& c, std::string_view key);

/// "host:port" -> parts; the error names `what`.
struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};
Result<HostPort> parse_host_port(std::string_view text, std::string_view what);

/// What is wrong with `url` as a broker URL of the cluster section (parsed as
/// the library parses it, no credentials); nullopt when nothing. A route's
/// (`for_routes`: cluster.routes, cluster.advertise, the URLs a route login
/// announces) is rdma:// or tcp://; a client's may also be tls://.
std::optional<std::string> check_cluster_url(const std::string& url, bool for_routes);

/// What is wrong with stream `s` on its own (docs/streams.md, "Declaring
/// streams"), or nothing: its name, its subjects (valid patterns, none of
/// the broker's own `$RB.` nor the reply inboxes `_INBOX.`), every limit in
/// its range. The YAML loader and `stream add` both check it.
std::optional<std::string> check_stream(const StreamSettings& s);

std::string_view to_string(RdmaMode m);
std::string_view to_string(TlsMode m);
std::string_view to_string(LogFormat f);
std::string_view to_string(LogTarget t);

}  // namespace rdmabroker::config
