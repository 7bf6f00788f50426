// SPDX-License-Identifier: Apache-2.0
// The structured settings of the config table (config.cpp): the YAML forms
// that are more than one scalar (auth.users with their permissions, subject
// pattern lists) and booleans, parsed and printed for the field table. A
// problem inside one is thrown as a FieldProblem at the element that has it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmabroker/config/config.hpp"

namespace rdmabroker::config::structured {

/// Thrown by a setter of a structured setting (auth.users) to report a
/// problem at the element that has it, not at the setting as a whole.
struct FieldProblem {
  YAML::Mark mark;
  std::string key_suffix;  // appended to the setting's key, e.g. "[1].publish.allow[0]"
  std::string message;
};

/// The text of scalar `n`, or the problem.
std::optional<std::string> scalar_text(const YAML::Node& n, std::string& out);
/// An unsigned integer in [lo, hi]; with `size`, also "64MiB", "16KiB", "1GiB".
std::optional<std::string> parse_uint(const YAML::Node& n, std::uint64_t lo, std::uint64_t hi, bool size,
                                      std::uint64_t& out);
/// true/yes/on, false/no/off; false if `n` is none of them.
bool parse_bool(const YAML::Node& n, bool& out);
/// Throws at the first key of `map` that is not in `known`.
void only_keys(const YAML::Node& map, const std::string& where,
               std::initializer_list<std::string_view> known);
void parse_patterns(const YAML::Node& n, const std::string& where, std::vector<std::string>& out);
void parse_permissions(const YAML::Node& n, const std::string& where, Permissions& out);
/// auth.users; the error text, or nothing (element problems are thrown).
std::optional<std::string> parse_users(const YAML::Node& n, Config& c);
std::string show_permissions(const Permissions& p);
/// streams (streams.cpp); element problems are thrown.
std::optional<std::string> parse_streams(const YAML::Node& n, Config& c);
std::string show_streams(const std::vector<StreamSettings>& streams);
std::string show_users(const std::vector<User>& users);

}  // namespace rdmabroker::config::structured
