// SPDX-License-Identifier: Apache-2.0
// rdmabroker stream ls|info|add|purge|rm: streams at run time, through the
// broker's admin socket (docs/streams.md, "Managing streams").
#include <iomanip>
#include <iostream>
#include <sstream>

#include "admin_client.hpp"
#include "commands.hpp"

namespace rdmabroker::cli {
namespace {

struct StreamArgs {
  std::string socket = kDefaultAdminSocket;
  std::string name;
  std::vector<std::string> subjects;
  std::uint64_t max_msgs = 0, max_bytes = 0, max_age_s = 0, max_msgs_per_subject = 0, max_msg_size = 0;
  std::uint64_t duplicate_window_s = 120;
  std::uint64_t duplicate_ids_max = 100000;
  std::string discard = "old";
  bool json = false;
};

/// Sends `stream <args>`; the reply, or the exit code of its failure.
std::variant<nlohmann::json, int> ask(const StreamArgs& a, const std::string& args) {
  auto r = admin_command(a.socket, "stream " + args);
  if (!r) return die_admin(r.error());
  if (!r.value().value("ok", false)) {
    std::cerr << "rdmabroker: " << r.value().value("error", std::string("refused")) << "\n";
    return kExitFailed;
  }
  return r.value();
}

void print_stream(const nlohmann::json& s) {
  std::cout << s["name"].get<std::string>() << (s["runtime"].get<bool>() ? " (added at run time)" : "")
            << "\n";
  std::cout << "  subjects:  ";
  for (const auto& p : s["subjects"]) std::cout << p.get<std::string>() << " ";
  std::cout << "\n  messages:  " << s["messages"] << " (" << s["bytes"] << " bytes), sequences "
            << s["first_sequence"] << ".." << s["last_sequence"] << "\n";
  std::cout << "  consumers: " << s["consumers"] << ", " << s["consumer_pending"]
            << " pending acknowledgement, " << s["redelivered"] << " redelivered\n";
  std::cout << "  limits:    max_msgs " << s["max_msgs"] << ", max_bytes " << s["max_bytes"] << ", max_age_s "
            << s["max_age_s"] << ", max_msgs_per_subject " << s["max_msgs_per_subject"] << ", discard "
            << s["discard"].get<std::string>() << "\n";
}

int run_stream(const std::string& verb, const StreamArgs& a) {
  std::string args = verb;
  if (verb == "add") {
    nlohmann::json j = {{"name", a.name},
                        {"subjects", a.subjects},
                        {"max_msgs", a.max_msgs},
                        {"max_bytes", a.max_bytes},
                        {"max_age_s", a.max_age_s},
                        {"max_msgs_per_subject", a.max_msgs_per_subject},
                        {"max_msg_size", a.max_msg_size},
                        {"discard", a.discard},
                        {"duplicate_window_s", a.duplicate_window_s},
                        {"duplicate_ids_max", a.duplicate_ids_max}};
    args += " " + j.dump();
  } else if (verb != "ls") {
    args += " " + a.name;
  }
  auto r = ask(a, args);
  if (auto* code = std::get_if<int>(&r)) return *code;
  const auto& reply = std::get<nlohmann::json>(r);
  if (a.json) {
    std::cout << reply.dump(2) << "\n";
  } else if (verb == "ls") {
    for (const auto& s : reply["streams"]) print_stream(s);
    if (reply["streams"].empty()) std::cout << "no streams\n";
  } else if (verb == "info") {
    print_stream(reply["stream"]);
  } else if (verb == "purge") {
    std::cout << "stream " << a.name << ": " << reply["purged"] << " messages purged\n";
  } else {
    std::cout << reply["message"].get<std::string>() << "\n";
  }
  return 0;
}

}  // namespace

Subcommand add_stream(CLI::App& app) {
  auto a = std::make_shared<StreamArgs>();
  auto verb = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("stream", "Manage streams: ls, info, add, purge, rm (admin socket)");
  cmd->require_subcommand(1);
  const auto common = [&](CLI::App* sub) {
    sub->add_option("--admin-socket", a->socket, "The broker's admin socket")->capture_default_str();
    sub->add_flag("--json", a->json, "JSON output");
  };
  common(cmd->add_subcommand("ls", "List the streams with their messages and consumers"));
  for (const char* v : {"info", "purge", "rm"}) {
    auto* sub = cmd->add_subcommand(v, std::string(v) == "info" ? "One stream's settings and numbers"
                                       : std::string(v) == "purge"
                                           ? "Remove every message (sequences go on)"
                                           : "Remove a stream `stream add` made, and its files");
    sub->add_option("name", a->name, "Stream name")->required();
    common(sub);
  }
  auto* add = cmd->add_subcommand("add", "Add a stream at run time (kept across restarts until `stream rm`)");
  add->add_option("name", a->name, "Stream name")->required();
  add->add_option("-s,--subjects", a->subjects, "Subject patterns it takes")->required()->delimiter(',');
  add->add_option("--max-msgs", a->max_msgs, "Messages kept at most (0: no limit)");
  add->add_option("--max-bytes", a->max_bytes, "Bytes kept at most (0: no limit)");
  add->add_option("--max-age", a->max_age_s, "Seconds a message is kept at most (0: no limit)");
  add->add_option("--max-msgs-per-subject", a->max_msgs_per_subject, "Keep the last N of each subject");
  add->add_option("--max-msg-size", a->max_msg_size, "Largest message it takes (0: any)");
  add->add_option("--discard", a->discard, "When full: drop the oldest (old) or refuse new ones (new)")
      ->check(CLI::IsMember({"old", "new"}));
  add->add_option("--duplicate-window", a->duplicate_window_s, "Seconds a Msg-Id is remembered")
      ->capture_default_str();
  add->add_option("--duplicate-ids-max", a->duplicate_ids_max,
                  "Msg-Ids remembered at most (the oldest go first)")
      ->capture_default_str();
  common(add);
  return {cmd, [cmd, a] {
            for (const char* v : {"ls", "info", "add", "purge", "rm"}) {
              if (cmd->get_subcommand(v)->parsed()) return run_stream(v, *a);
            }
            return kExitUsage;
          }};
}

}  // namespace rdmabroker::cli
