// SPDX-License-Identifier: Apache-2.0
#include "stream/consumer_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "store/segment.hpp"

namespace rdmabroker::daemon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json to_json(const Consumer::State& s) {
  const auto& c = s.config;
  json pending = json::array();
  for (const auto& [sequence, deliveries] : s.pending) pending.push_back({sequence, deliveries});
  json j = {{"version", 1},
            {"config",
             {{"start", static_cast<int>(c.start)},
              {"ack", static_cast<int>(c.ack)},
              {"pull", c.pull},
              {"original_pace", c.original_pace},
              {"max_ack_pending", c.max_ack_pending},
              {"start_at", c.start_at},
              {"ack_wait_ms", c.ack_wait_ms},
              {"max_deliver", c.max_deliver}}},
            {"next", s.next},
            {"pending", pending},
            {"initial", s.initial}};
  if (s.owner) j["owner"] = *s.owner;
  return j;
}

Consumer::State from_json(const json& j) {
  Consumer::State s;
  if (j.contains("owner")) s.owner = j.at("owner").get<std::string>();
  const json& c = j.at("config");
  s.config.start = static_cast<proto::ConsumerStart>(c.at("start").get<int>());
  s.config.ack = static_cast<proto::ConsumerAck>(c.at("ack").get<int>());
  s.config.pull = c.at("pull").get<bool>();
  s.config.original_pace = c.at("original_pace").get<bool>();
  s.config.max_ack_pending = c.at("max_ack_pending").get<std::uint32_t>();
  s.config.start_at = c.at("start_at").get<std::uint64_t>();
  s.config.ack_wait_ms = c.at("ack_wait_ms").get<std::uint32_t>();
  s.config.max_deliver = c.at("max_deliver").get<std::uint32_t>();
  s.next = j.at("next").get<std::uint64_t>();
  for (const auto& p : j.at("pending"))
    s.pending.emplace_back(p.at(0).get<std::uint64_t>(), p.at(1).get<std::uint32_t>());
  s.initial = j.at("initial").get<std::vector<std::uint64_t>>();
  return s;
}

}  // namespace

Status save_consumer(const std::string& stream_dir, const std::string& name, const Consumer::State& state,
                     bool sync) {
  const fs::path dir = fs::path(stream_dir) / "consumers";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (auto st = store::replace_file((dir / (name + ".json")).string(), to_json(state).dump(), sync); !st)
    return Error{ErrorKind::kResource, st.error().message};
  return Status{};
}

void remove_consumer_file(const std::string& stream_dir, const std::string& name) {
  std::error_code ec;
  fs::remove(fs::path(stream_dir) / "consumers" / (name + ".json"), ec);
}

std::vector<std::pair<std::string, Consumer::State>> load_consumers(const std::string& stream_dir,
                                                                    std::vector<std::string>& problems) {
  std::vector<std::pair<std::string, Consumer::State>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(stream_dir) / "consumers", ec)) {
    if (e.path().extension() != ".json") continue;
    try {
      std::ifstream in(e.path());
      out.emplace_back(e.path().stem().string(), from_json(json::parse(in)));
    } catch (const std::exception& x) {
      problems.push_back("consumer file " + e.path().string() + " left out: " + x.what());
    }
  }
  return out;
}

}  // namespace rdmabroker::daemon
