// SPDX-License-Identifier: Apache-2.0
// The structured settings (structured.hpp): booleans, subject pattern lists,
// permissions and auth.users.
#include "structured.hpp"

#include <crypt.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <cstdio>
#include <functional>
#include <set>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::config::structured {

bool parse_bool(const YAML::Node& n, bool& out) {
  if (!n.IsScalar()) return false;
  const std::string& t = n.Scalar();
  if (t == "true" || t == "yes" || t == "on")
    out = true;
  else if (t == "false" || t == "no" || t == "off")
    out = false;
  else
    return false;
  return true;
}

/// Reports an unknown key of a mapping inside a structured setting.
void only_keys(const YAML::Node& map, const std::string& where,
               std::initializer_list<std::string_view> known) {
  for (const auto& kv : map) {
    const std::string k = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw FieldProblem{kv.first.Mark(), where + "." + k, "unknown key"};
    }
  }
}

std::optional<std::string> scalar_text(const YAML::Node& n, std::string& out) {
  if (!n.IsScalar()) return "expected a single value";
  out = n.Scalar();
  return std::nullopt;
}

/// An unsigned integer in [lo, hi]; with `size`, also "64MiB", "16KiB", "1GiB".
std::optional<std::string> parse_uint(const YAML::Node& n, std::uint64_t lo, std::uint64_t hi, bool size,
                                      std::uint64_t& out) {
  std::string text;
  if (auto e = scalar_text(n, text)) return e;
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  std::uint64_t mult = 1;
  if (ec == std::errc{} && p != end && size) {
    const std::string_view unit(p, static_cast<std::size_t>(end - p));
    if (unit == "KiB")
      mult = 1ull << 10;
    else if (unit == "MiB")
      mult = 1ull << 20;
    else if (unit == "GiB")
      mult = 1ull << 30;
    else
      mult = 0;
    p = end;
  }
  const std::string range = std::to_string(lo) + " and " + std::to_string(hi);
  if (ec != std::errc{} || p != end || mult == 0 || v > std::numeric_limits<std::uint64_t>::max() / mult) {
    return "expected " + std::string(size ? "a size (bytes, or with KiB/MiB/GiB)" : "an integer") +
           " between " + range + ", got '" + text + "'";
  }
  v *= mult;
  if (v < lo || v > hi) return "must be between " + range + ", got " + std::to_string(v);
  out = v;
  return std::nullopt;
}

void parse_patterns(const YAML::Node& n, const std::string& where, std::vector<std::string>& out) {
  if (!n.IsSequence())
    throw FieldProblem{n.Mark(), where, "expected a list of subject patterns, e.g. [\"orders.>\"]"};
  out.clear();
  std::size_t i = 0;
  for (const auto& p : n) {
    const std::string at = where + "[" + std::to_string(i++) + "]";
    if (!p.IsScalar() || !proto::valid_pattern(p.Scalar())) {
      throw FieldProblem{p.Mark(), at,
                         "not a valid subject pattern (docs/subjects.md): '" +
                             (p.IsScalar() ? p.Scalar() : std::string("?")) + "'"};
    }
    out.push_back(p.Scalar());
  }
}

static void parse_rules(const YAML::Node& n, const std::string& where, SubjectRules& out) {
  if (!n.IsMap()) throw FieldProblem{n.Mark(), where, "expected a mapping with allow and/or deny lists"};
  only_keys(n, where, {"allow", "deny"});
  if (n["allow"]) parse_patterns(n["allow"], where + ".allow", out.allow);
  if (n["deny"]) parse_patterns(n["deny"], where + ".deny", out.deny);
}

/// Reading a stream was once a subscription to `$RB.STREAM.<name>`; a rule
/// written for that would now match nothing the broker checks, so an
/// operator's deny would be void without a word. Refused, naming the key
/// that replaced it.
static void refuse_stream_subjects(const YAML::Node& n, const std::string& where, const SubjectRules& r) {
  for (const auto* list : {&r.allow, &r.deny}) {
    for (const auto& p : *list) {
      if (p.starts_with("$RB.STREAM.")) {
        throw FieldProblem{n.Mark(), where,
                           "'" + p +
                               "': which streams a user may read is streams.read (stream names), "
                               "not a subscription to $RB.STREAM.<name> (docs/security.md#streams)"};
      }
    }
  }
}

void parse_permissions(const YAML::Node& n, const std::string& where, Permissions& out) {
  if (n["publish"]) parse_rules(n["publish"], where + ".publish", out.publish);
  if (n["subscribe"]) {
    parse_rules(n["subscribe"], where + ".subscribe", out.subscribe);
    refuse_stream_subjects(n["subscribe"], where + ".subscribe", out.subscribe);
  }
  if (const YAML::Node st = n["streams"]) {
    const std::string at = where + ".streams";
    if (!st.IsMap()) throw FieldProblem{st.Mark(), at, "expected a mapping with read and/or join rules"};
    only_keys(st, at, {"read", "join"});
    if (st["read"]) parse_rules(st["read"], at + ".read", out.streams.read);
    if (st["join"]) parse_rules(st["join"], at + ".join", out.streams.join);
  }
}

/// A crypt(3) hash as `rdmabroker passwd` writes it; a plain-text secret is
/// refused so that one never sits in the file by mistake.
static void check_hash(const YAML::Node& n, const std::string& where) {
  if (!n.IsScalar() || n.Scalar().empty() || n.Scalar()[0] != '$' ||
      crypt_checksalt(n.Scalar().c_str()) != CRYPT_SALT_OK) {
    throw FieldProblem{
        n.Mark(), where,
        "expected a crypt(3) hash such as `rdmabroker passwd` prints ($y$..., $6$..., $2b$...), "
        "never the secret itself"};
  }
}

std::optional<std::string> parse_users(const YAML::Node& n, Config& c) {
  if (!n.IsSequence())
    return "expected a list of users (- name: ..., password: ... or token: ... or certificate: true)";
  std::vector<User> users;
  std::set<std::string> names;
  std::size_t i = 0;
  for (const auto& u : n) {
    const std::string at = "[" + std::to_string(i++) + "]";
    if (!u.IsMap())
      throw FieldProblem{u.Mark(), at, "expected a mapping with name and password, token or certificate"};
    only_keys(u, at, {"name", "password", "token", "certificate", "publish", "subscribe", "streams"});
    User user;
    const YAML::Node name = u["name"];
    if (!name || !name.IsScalar() || name.Scalar().empty() || name.Scalar().size() > 255) {
      throw FieldProblem{name ? name.Mark() : u.Mark(), at + ".name",
                         "every user needs a name (1..255 characters)"};
    }
    user.name = name.Scalar();
    if (!names.insert(user.name).second)
      throw FieldProblem{name.Mark(), at + ".name", "duplicate user '" + user.name + "'"};
    const YAML::Node password = u["password"], token = u["token"], certificate = u["certificate"];
    if (certificate && (!parse_bool(certificate, user.certificate) || !user.certificate)) {
      throw FieldProblem{
          certificate.Mark(), at + ".certificate",
          "expected true (the user is whoever presents a client certificate with CN " + user.name + ")"};
    }
    if (int(bool(password)) + int(bool(token)) + int(user.certificate) != 1) {
      throw FieldProblem{
          u.Mark(), at,
          "user '" + user.name + "' needs exactly one of password, token and certificate: true"};
    }
    if (user.certificate) {
      // The verified client certificate is the credential (tls.client_ca).
    } else if (password) {
      check_hash(password, at + ".password");
      user.password_hash = password.Scalar();
    } else {
      check_hash(token, at + ".token");
      user.token_hash = token.Scalar();
    }
    parse_permissions(u, at, user.permissions);
    users.push_back(std::move(user));
  }
  c.broker.auth.users = std::move(users);
  return std::nullopt;
}

static std::string show_rules(const SubjectRules& r) {
  std::string s;
  for (const auto& a : r.allow) s += (s.empty() ? "+" : " +") + a;
  for (const auto& d : r.deny) s += (s.empty() ? "-" : " -") + d;
  return s.empty() ? "none" : s;
}

std::string show_permissions(const Permissions& p) {
  return "publish " + show_rules(p.publish) + "; subscribe " + show_rules(p.subscribe) + "; streams read " +
         show_rules(p.streams.read) + ", join " + show_rules(p.streams.join);
}

/// What a reload logs about users: names, credential kind with a short
/// fingerprint of the hash (so a changed password shows), permissions.
std::string show_users(const std::vector<User>& users) {
  std::string s = "[";
  for (const auto& u : users) {
    const std::string& hash = u.password_hash.empty() ? u.token_hash : u.password_hash;
    char fp[9];
    std::snprintf(fp, sizeof fp, "%08x", static_cast<unsigned>(std::hash<std::string>{}(hash)));
    const std::string credential = u.certificate             ? std::string("certificate")
                                   : u.password_hash.empty() ? std::string("token ") + fp
                                                             : std::string("password ") + fp;
    s += (s.size() > 1 ? ", " : "") + u.name + " (" + credential + "; " + show_permissions(u.permissions) +
         ")";
  }
  return s + "]";
}

}  // namespace rdmabroker::config::structured
