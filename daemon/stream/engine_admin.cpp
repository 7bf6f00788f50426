// SPDX-License-Identifier: Apache-2.0
// Streams managed at run time (stream/admin.hpp): what `rdmabroker stream`
// asks through the admin socket, on the main thread, and the stream.json of
// a stream it added.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rdmabroker/config/config.hpp"
#include "rdmabroker/proto/subjects.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "stream/admin.hpp"
#include "stream/engine.hpp"

namespace rdmabroker::daemon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json settings_json(const config::StreamSettings& s) {
  return {{"name", s.name},
          {"subjects", s.subjects},
          {"max_msgs", s.max_msgs},
          {"max_bytes", s.max_bytes},
          {"max_age_s", s.max_age_s},
          {"max_msgs_per_subject", s.max_msgs_per_subject},
          {"max_msg_size", s.max_msg_size},
          {"discard", s.discard == config::StreamDiscard::kNew ? "new" : "old"},
          {"duplicate_window_s", s.duplicate_window_s},
          {"duplicate_ids_max", s.duplicate_ids_max}};
}

/// `j` as stream settings; the fields it leaves out keep their defaults.
std::optional<config::StreamSettings> settings_of(const json& j, std::string& why) {
  config::StreamSettings s;
  try {
    s.name = j.at("name").get<std::string>();
    s.subjects = j.at("subjects").get<std::vector<std::string>>();
    // Whole numbers from 0 only: a -1 or 1e30 would otherwise come out as some other number.
    const auto count = [&](const char* key, std::uint64_t& out) {
      if (!j.contains(key)) return true;
      if (!j.at(key).is_number_unsigned()) {
        why = std::string(key) + " must be a whole number from 0, got " + j.at(key).dump();
        return false;
      }
      out = j.at(key).get<std::uint64_t>();
      return true;
    };
    if (!count("max_msgs", s.max_msgs) || !count("max_bytes", s.max_bytes) ||
        !count("max_age_s", s.max_age_s) || !count("max_msgs_per_subject", s.max_msgs_per_subject) ||
        !count("max_msg_size", s.max_msg_size) || !count("duplicate_window_s", s.duplicate_window_s) ||
        !count("duplicate_ids_max", s.duplicate_ids_max))
      return std::nullopt;
    const std::string discard = j.value("discard", std::string("old"));
    if (discard != "old" && discard != "new") {
      why = "discard is old or new";
      return std::nullopt;
    }
    s.discard = discard == "new" ? config::StreamDiscard::kNew : config::StreamDiscard::kOld;
  } catch (const std::exception& e) {
    why = std::string("stream settings: ") + e.what();
    return std::nullopt;
  }
  if (auto problem = config::check_stream(s)) {
    why = *problem;
    return std::nullopt;
  }
  return s;
}

json listing_json(const StreamEngine::Listing& l) {
  json j = settings_json(l.settings);
  const StreamStats& m = *l.stats;
  j["runtime"] = l.runtime;
  j["messages"] = m.messages.get();
  j["bytes"] = m.bytes.get();
  j["first_sequence"] = m.first_sequence.get();
  j["last_sequence"] = m.last_sequence.get();
  j["subjects_stored"] = m.subjects.get();
  j["disk_bytes"] = m.disk_bytes.get();
  j["consumers"] = m.consumers.get();
  j["consumer_pending"] = m.consumer_pending.get();
  j["delivered"] = m.delivered.get();
  j["redelivered"] = m.redelivered.get();
  j["corrupt_records"] = m.corrupt_records.get();
  return j;
}

json error_json(const std::string& why) { return {{"ok", false}, {"error", why}}; }

}  // namespace

void remember_runtime(const std::string& directory, const config::StreamSettings& s) {
  std::error_code ec;
  fs::create_directories(fs::path(directory) / s.name, ec);
  std::ofstream(fs::path(directory) / s.name / "stream.json") << settings_json(s).dump(2) << "\n";
}

void forget_runtime(const std::string& directory, const std::string& name) {
  std::error_code ec;
  fs::remove(fs::path(directory) / name / "stream.json", ec);
}

std::optional<config::StreamSettings> runtime_settings(const std::string& directory, const std::string& name,
                                                       std::string& why) {
  std::ifstream in(fs::path(directory) / name / "stream.json");
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    why = "stream.json is not JSON";
    return std::nullopt;
  }
  auto s = settings_of(j, why);
  if (s && s->name != name) {
    why = "stream.json names " + s->name + ", not its directory";
    return std::nullopt;
  }
  return s;
}

void delete_stream_files(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) spdlog::error("stream files in {} not deleted: {}", dir, ec.message());
}

std::optional<std::string> StreamEngine::overlap(const config::StreamSettings& s, bool runtime_only) const {
  for (const auto& [name, r] : registered_) {
    if (name == s.name || (runtime_only && !r.runtime)) continue;
    for (const auto& p : s.subjects) {
      for (const auto& q : r.settings.subjects) {
        if (proto::patterns_intersect(p, q)) return "'" + p + "' overlaps '" + q + "' of stream " + name;
      }
    }
  }
  return std::nullopt;
}

void StreamEngine::open_runtime_streams() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(directory_, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || registered_.contains(name)) continue;
    std::string why;
    auto s = runtime_settings(directory_, name, why);
    if (!s) {
      if (!why.empty()) spdlog::error("stream {}: {}; left out", name, why);
      continue;
    }
    if (auto st = add(*s); !st) spdlog::error("stream {}: {}; left out", name, st.error().message);
  }
}

std::vector<StreamEngine::Listing> StreamEngine::list() const {
  std::vector<Listing> out;
  std::lock_guard lock(stats_mu_);
  for (const auto& [name, r] : registered_) {
    auto it = stats_.find(name);
    if (it != stats_.end()) out.push_back({r.settings, r.runtime, it->second});
  }
  return out;
}

Status StreamEngine::add(const config::StreamSettings& s) {
  if (registered_.contains(s.name)) return Error{ErrorKind::kInvalidArgument, "stream " + s.name + " exists"};
  if (auto o = overlap(s))
    return Error{ErrorKind::kInvalidArgument, *o + ": a subject belongs to one stream at most"};
  const std::uint32_t id = next_id_++;
  auto stream = open(s, id);
  if (!stream) return stream.error();
  remember_runtime(directory_, s);
  if (thread_.joinable()) {
    post(AddStream{std::move(stream.value())});
  } else {
    streams_.emplace(id, std::move(stream.value()));  // create(): the thread has not started
  }
  register_stream(s, id);
  registered_[s.name].runtime = true;
  spdlog::info("stream {}: added at run time", s.name);
  return {};
}

Status StreamEngine::remove(const std::string& name) {
  auto it = registered_.find(name);
  if (it == registered_.end()) return Error{ErrorKind::kInvalidArgument, "no stream " + name};
  if (!it->second.runtime) {
    return Error{ErrorKind::kInvalidArgument,
                 "stream " + name + " is declared in the configuration file: remove it there and reload"};
  }
  unregister_stream(it->second);
  auto done = std::make_shared<std::promise<void>>();
  auto deleted = done->get_future();
  post(RemoveStream{it->second.id, true, done});
  {
    std::lock_guard lock(stats_mu_);
    stats_.erase(name);
  }
  registered_.erase(it);
  // Its directory is gone before a stream of the same name may be added.
  if (deleted.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return Error{ErrorKind::kTimeout, "stream " + name + ": removed, its files not deleted within 30 s"};
  spdlog::info("stream {}: removed, its files deleted", name);
  return {};
}

Result<std::uint64_t> StreamEngine::purge(const std::string& name) {
  auto it = registered_.find(name);
  if (it == registered_.end()) return Error{ErrorKind::kInvalidArgument, "no stream " + name};
  auto done = std::make_shared<std::promise<Result<std::uint64_t>>>();
  auto answer = done->get_future();
  post(PurgeStream{it->second.id, done});
  if (answer.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return Error{ErrorKind::kTimeout, "stream " + name + ": the purge did not finish within 30 s"};
  return answer.get();
}

void StreamEngine::on_purge(PurgeStream& p) {
  auto it = streams_.find(p.id);
  if (it == streams_.end())
    return p.done->set_value(Error{ErrorKind::kInvalidArgument, "the stream is gone"});
  Stream& s = it->second;
  if (s.dirty) sync(s);
  save_duplicates(s);  // a purge removes the records the window is rebuilt from
  auto r = s.store->purge();
  refresh(s);
  if (!r) return p.done->set_value(Error{ErrorKind::kResource, r.error().message});
  spdlog::info("stream {}: purged, {} messages removed", s.stats->name, r.value());
  p.done->set_value(r.value());
}

std::string stream_admin(StreamEngine* engine, std::string_view args) {
  if (engine == nullptr) return error_json("this broker keeps no streams").dump();
  while (!args.empty() && args.front() == ' ') args.remove_prefix(1);
  const auto space = args.find(' ');
  const std::string verb(args.substr(0, space));
  const std::string rest(space == std::string_view::npos ? std::string_view() : args.substr(space + 1));
  json reply = {{"ok", true}};
  if (verb == "ls") {
    json streams = json::array();
    for (const auto& l : engine->list()) streams.push_back(listing_json(l));
    reply["streams"] = streams;
  } else if (verb == "info") {
    for (const auto& l : engine->list()) {
      if (l.settings.name == rest) reply["stream"] = listing_json(l);
    }
    if (!reply.contains("stream")) return error_json("no stream " + rest).dump();
  } else if (verb == "add") {
    std::string why = "stream add takes the settings as JSON";
    const json j = json::parse(rest, nullptr, false);
    auto s = j.is_discarded() ? std::nullopt : settings_of(j, why);
    if (!s) return error_json(why).dump();
    if (auto st = engine->add(*s); !st) return error_json(st.error().message).dump();
    reply["message"] = "stream " + s->name + " added";
  } else if (verb == "rm") {
    if (auto st = engine->remove(rest); !st) return error_json(st.error().message).dump();
    reply["message"] = "stream " + rest + " removed";
  } else if (verb == "purge") {
    auto r = engine->purge(rest);
    if (!r) return error_json(r.error().message).dump();
    reply["purged"] = r.value();
  } else {
    return error_json("stream commands: ls, info NAME, add JSON, purge NAME, rm NAME").dump();
  }
  return reply.dump();
}

}  // namespace rdmabroker::daemon
