// SPDX-License-Identifier: Apache-2.0
// The `streams:` list (docs/streams.md, docs/configuration.md): each
// stream's name, subjects and retention, checked element by element.
#include <set>

#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "structured.hpp"

namespace rdmabroker::config {
namespace {

/// Each limit's range (0: none), stated in docs/streams.md.
struct LimitRange {
  const char* key;
  std::uint64_t StreamSettings::*field;
  std::uint64_t max;
};
constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 50;
constexpr LimitRange kLimits[] = {
    {"max_msgs", &StreamSettings::max_msgs, kMaxCount},
    {"max_bytes", &StreamSettings::max_bytes, kMaxCount},
    {"max_age_s", &StreamSettings::max_age_s, 100ull * 365 * 86400},  // a century
    {"max_msgs_per_subject", &StreamSettings::max_msgs_per_subject, kMaxCount},
    {"max_msg_size", &StreamSettings::max_msg_size, std::uint64_t{1} << 30},
    {"duplicate_window_s", &StreamSettings::duplicate_window_s, 7 * 86400},  // a week
    {"duplicate_ids_max", &StreamSettings::duplicate_ids_max, 10'000'000},
};

/// Subjects a stream may not take: the broker's own and the reply inboxes
/// (a stream there would store every advisory or every reply).
constexpr std::string_view kNotForStreams[] = {"$RB.>", "_INBOX.>"};

}  // namespace

std::optional<std::string> check_stream(const StreamSettings& s) {
  if (!proto::valid_name(s.name)) return "a stream's name is 1..64 letters, digits, '_' or '-'";
  if (s.subjects.empty()) return "stream '" + s.name + "' needs subjects";
  for (const auto& p : s.subjects) {
    if (!proto::valid_pattern(p)) return "'" + p + "' is not a subject pattern (docs/subjects.md)";
    for (const auto reserved : kNotForStreams) {
      if (proto::patterns_intersect(p, reserved)) {
        return "'" + p + "' takes subjects of " + std::string(reserved) +
               ", which no stream may: $RB. is the broker's own, _INBOX. carries replies";
      }
    }
  }
  if (s.duplicate_ids_max == 0)
    return "duplicate_ids_max must be between 1 and 10000000 (duplicate_window_s 0 turns detection off)";
  for (const auto& l : kLimits) {
    if (s.*l.field > l.max)
      return std::string(l.key) + " must be between 0 and " + std::to_string(l.max) + ", got " +
             std::to_string(s.*l.field);
  }
  return std::nullopt;
}

namespace structured {
namespace {

void limit(const YAML::Node& s, const std::string& at, const char* key, bool size, std::uint64_t& out) {
  if (const YAML::Node n = s[key]) {
    if (auto e = parse_uint(n, 0, std::uint64_t{1} << 50, size, out))
      throw FieldProblem{n.Mark(), at + "." + key, *e};
  }
}

StreamSettings parse_stream(const YAML::Node& s, const std::string& at) {
  if (!s.IsMap()) throw FieldProblem{s.Mark(), at, "expected a mapping with name and subjects"};
  only_keys(s, at,
            {"name", "subjects", "max_msgs", "max_bytes", "max_age_s", "max_msgs_per_subject", "max_msg_size",
             "discard", "duplicate_window_s", "duplicate_ids_max"});
  StreamSettings out;
  const YAML::Node name = s["name"];
  if (!name || !name.IsScalar() || !proto::valid_name(name.Scalar())) {
    throw FieldProblem{name ? name.Mark() : s.Mark(), at + ".name",
                       "every stream needs a name of 1..64 letters, digits, '_' or '-'"};
  }
  out.name = name.Scalar();
  const YAML::Node subjects = s["subjects"];
  if (!subjects) throw FieldProblem{s.Mark(), at + ".subjects", "stream '" + out.name + "' needs subjects"};
  parse_patterns(subjects, at + ".subjects", out.subjects);
  if (out.subjects.empty()) {
    throw FieldProblem{subjects.Mark(), at + ".subjects", "stream '" + out.name + "' needs subjects"};
  }
  limit(s, at, "max_msgs", false, out.max_msgs);
  limit(s, at, "max_bytes", true, out.max_bytes);
  limit(s, at, "max_age_s", false, out.max_age_s);
  limit(s, at, "max_msgs_per_subject", false, out.max_msgs_per_subject);
  limit(s, at, "max_msg_size", true, out.max_msg_size);
  limit(s, at, "duplicate_window_s", false, out.duplicate_window_s);
  limit(s, at, "duplicate_ids_max", false, out.duplicate_ids_max);
  if (const YAML::Node d = s["discard"]) {
    if (!d.IsScalar() || (d.Scalar() != "old" && d.Scalar() != "new")) {
      throw FieldProblem{d.Mark(), at + ".discard", "expected old or new"};
    }
    out.discard = d.Scalar() == "new" ? StreamDiscard::kNew : StreamDiscard::kOld;
  }
  if (auto why = check_stream(out)) throw FieldProblem{s.Mark(), at, *why};
  return out;
}

}  // namespace

std::optional<std::string> parse_streams(const YAML::Node& n, Config& c) {
  if (!n.IsSequence()) return "expected a list of streams (- name: ..., subjects: [...])";
  std::vector<StreamSettings> streams;
  std::set<std::string> names;
  std::size_t i = 0;
  for (const auto& s : n) {
    const std::string at = "[" + std::to_string(i++) + "]";
    StreamSettings stream = parse_stream(s, at);
    if (!names.insert(stream.name).second) {
      throw FieldProblem{s["name"].Mark(), at + ".name", "duplicate stream '" + stream.name + "'"};
    }
    // A message is stored once: two streams taking the same subject would
    // each give it a sequence, and neither would be the message's.
    for (const auto& other : streams) {
      for (const auto& p : stream.subjects) {
        for (const auto& q : other.subjects) {
          if (proto::patterns_intersect(p, q)) {
            throw FieldProblem{s["subjects"].Mark(), at + ".subjects",
                               "'" + p + "' overlaps '" + q + "' of stream '" + other.name +
                                   "': a subject belongs to one stream at most"};
          }
        }
      }
    }
    streams.push_back(std::move(stream));
  }
  c.broker.streams = std::move(streams);
  return std::nullopt;
}

std::string show_streams(const std::vector<StreamSettings>& streams) {
  std::string out = "[";
  for (const auto& s : streams) {
    if (out.size() > 1) out += "; ";
    out += s.name + " {";
    for (std::size_t i = 0; i < s.subjects.size(); ++i) out += (i ? ", " : "") + s.subjects[i];
    out += "} max_msgs " + std::to_string(s.max_msgs) + " max_bytes " + std::to_string(s.max_bytes) +
           " max_age_s " + std::to_string(s.max_age_s) + " max_msgs_per_subject " +
           std::to_string(s.max_msgs_per_subject) + " max_msg_size " + std::to_string(s.max_msg_size) +
           " discard " + (s.discard == StreamDiscard::kNew ? "new" : "old") + " duplicate_window_s " +
           std::to_string(s.duplicate_window_s) + " duplicate_ids_max " + std::to_string(s.duplicate_ids_max);
  }
  return out + "]";
}

}  // namespace structured
}  // namespace rdmabroker::config
