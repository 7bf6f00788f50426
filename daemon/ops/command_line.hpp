// SPDX-License-Identifier: Apache-2.0
// rdmabrokerd's command line, and the one precedence rule it follows
// (docs/configuration.md, "Precedence"): built-in default < config file <
// command-line flag. The daemon reads no settings from its environment.
//
// Every flag declares the configuration keys it sets, so that the rule can be
// applied on start and again on every reload (a flag keeps winning over an
// edited file), tested flag by flag, and explained: `--check-config` and
// `rdmabroker stat` say where each effective listen address came from.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "rdmabroker/config/config.hpp"
#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon {

/// A flag as the operator gave it: its name and the setter of its value.
struct GivenFlag {
  std::string name;               // "--listen"
  std::vector<std::string> keys;  // the config keys it sets, e.g. {"listen.rdma", "listen.tcp"}
  std::function<void(config::Config&)> apply;
};

struct CommandLine {
  /// The file: --config's, else the default path when it exists, else none.
  std::string config_path;
  /// Why config_path is what it is, for the start-up log line.
  std::string config_origin;
  bool check_only = false;  // --check-config
  /// --reload: ask the running broker (its admin socket: --admin-socket, else
  /// the default) to reload its file, print the outcome and exit with it.
  /// What the unit's ExecReload runs: nothing outside the daemon's package.
  bool reload_only = false;
  std::string check_path;  // its argument (empty: config_path)
  /// Flags that override the file, in the order they are applied: a flag
  /// that claims a broader setting (--listen) before a narrower one (--tcp-listen).
  std::vector<GivenFlag> flags;

  /// Applies every given flag over `c` (a file's settings, or the defaults).
  void apply(config::Config& c) const;
  /// The flag that sets `key`, if one was given (the last one applied).
  std::optional<std::string> flag_for(std::string_view key) const;
};

/// Parses argv. An error (bad flag, --help, --version) carries what to print
/// and the exit code; kOk means --help or --version printed to stdout.
struct CommandLineExit {
  int code = 0;
  std::string text;
};
std::variant<CommandLine, CommandLineExit> parse_command_line(int argc, const char* const* argv);

/// Every flag that overrides a config key: name -> keys (for tests and docs).
std::vector<std::pair<std::string, std::vector<std::string>>> overriding_flags();

/// Where each listener's effective address came from, one line each, e.g.
/// "listen.tcp  127.0.0.1:7471  (host: --listen; port: default)". `path` is
/// the file read ("" when none).
std::vector<std::string> describe_listeners(const config::Config& effective, const CommandLine& cl,
                                            const std::string& path);

}  // namespace rdmabroker::daemon
