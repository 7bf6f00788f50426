// SPDX-License-Identifier: Apache-2.0
// rdmabroker: command-line client built on librdmabroker.
//   rdmabroker pub SUBJECT [MESSAGE|-]   publish (a message, or each line of stdin)
//   rdmabroker pub SUBJECT --file F|-    publish a file (or all of stdin) as one message
//   rdmabroker sub SUBJECT [--count N] [--queue GROUP]
//                                        print messages as they arrive (wildcards allowed)
//   rdmabroker request SUBJECT MESSAGE   send a request, print the first reply
//   rdmabroker reply SUBJECT MESSAGE     answer every request on SUBJECT with MESSAGE
//   rdmabroker consume STREAM [--durable NAME] [--from SEQ|--since T|--last] [--ack]
//                                        read a stream through a consumer (docs/streams.md)
//   rdmabroker stream add|ls|info|purge|rm   manage streams (admin socket)
//   rdmabroker stat [--json]             the broker's counters and connections (admin socket)
//   rdmabroker reload                    reload the broker's configuration (admin socket)
//   rdmabroker bench [SUBJECT]           N publishers -> M subscribers: rates, loss, latency
// The broker URL is rdma://host[:port], tcp://host[:port] or tls://host[:port]
// (--server, or RDMABROKER_URL). With neither, rdma://localhost:7470, or
// tcp://localhost:7471 on a host without RDMA devices (a URL the user gave is
// never changed).
//
// Exit codes, the same for every subcommand (docs/cli.md; sysexits(3) where
// one fits):
//   0  done
//   1  failed (the connection was lost, the broker sent an error, a bad subject...)
//   3  timed out (sub --timeout, request --timeout)
//   4  no responders (request)
//   64 usage error (EX_USAGE)
//   66 the --file cannot be read (EX_NOINPUT)
//   69 the broker (or its admin socket) cannot be reached or refused the connection (EX_UNAVAILABLE)
//   77 credentials or permission refused by the broker (EX_NOPERM)
#include <crypt.h>
#include <sysexits.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "commands.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::cli {
namespace {

/// The message line `sub` prints, then its headers, one "  Name: value" line each.
void print_message(std::uint64_t n, const rdmabroker::Message& m) {
  std::cout << "[#" << n << "] " << m.subject << ": " << m.data() << "\n";
  for (const auto& [name, value] : m.headers) std::cout << "  " << name << ": " << value << "\n";
}

int run_pub(const Common& common, const std::string& subject, const std::string& message, std::uint64_t count,
            const std::vector<std::string>& header_options, const std::string& file, bool ack) {
  const rdmabroker::Headers headers = headers_or_die(header_options);
  std::string contents;  // --file: the whole file (or stdin) as one message, bytes as they are
  if (!file.empty()) {
    if (file == "-") {
      contents.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      int err = 0;
      std::error_code ec;
      if (std::filesystem::is_directory(file, ec)) {
        err = EISDIR;
      } else {
        errno = 0;
        std::ifstream in(file, std::ios::binary);
        if (in) {
          contents.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        } else {
          err = errno != 0 ? errno : ENOENT;
        }
      }
      if (err != 0) {
        std::cerr << "rdmabroker: --file " << file << ": " << std::strerror(err) << "\n";
        return kExitNoInput;
      }
    }
  }
  auto client = connect_or_die(common);
  auto publish = [&](std::string_view payload) -> rdmabroker::Status {
    if (!ack)
      return headers.empty() ? client->publish(subject, payload) : client->publish(subject, headers, payload);
    // --ack: one at a time, each stored durably before the next (docs/streams.md).
    auto r =
        client->publish_acked(subject, headers, rdmabroker::as_payload(payload), std::chrono::seconds(30));
    if (!r) return r.error();
    std::cout << r->stream << " " << r->sequence << (r->duplicate ? " duplicate" : "") << "\n" << std::flush;
    return {};
  };
  std::uint64_t sent = 0;
  if (!file.empty()) {
    for (std::uint64_t i = 0; i < count && !g_interrupted; ++i) {
      if (auto st = publish(contents); !st) return die(st.error());
      ++sent;
    }
  } else if (message == "-") {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (auto st = publish(line); !st) return die(st.error());
      ++sent;
    }
  } else {
    for (std::uint64_t i = 0; i < count && !g_interrupted; ++i) {
      if (auto st = publish(message); !st) return die(st.error());
      ++sent;
    }
  }
  // flush: the broker has routed every message once this returns.
  if (auto st = client->flush(std::chrono::seconds(30)); !st) return die(st.error());
  if (common.verbose) std::cerr << "published " << sent << " message(s) to " << subject << "\n";
  client->close();
  return refused_or(0);
}

int run_sub(const Common& common, const std::string& subject, const std::string& queue, std::uint64_t count,
            bool raw, double timeout_s) {
  auto [client, sub] = subscribe_or_die(common, subject, queue);
  // Scripts wait for this line to know the subscription is active.
  std::cerr << "subscribed to " << subject << (queue.empty() ? "" : " in queue group " + queue) << "\n";
  std::uint64_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while ((count == 0 || got < count) && !g_interrupted) {
    if (timeout_s > 0 && std::chrono::steady_clock::now() >= deadline) {
      std::cerr << "rdmabroker: timed out after " << got << " message(s)\n";
      return kExitTimeout;
    }
    auto m = sub->next(std::chrono::milliseconds(200));
    if (!m) {
      if (m.error().kind == rdmabroker::ErrorKind::kTimeout) continue;
      return die(m.error());
    }
    ++got;
    if (raw) {
      std::cout << m->data() << "\n";
    } else {
      print_message(got, *m);
    }
    std::cout.flush();
  }
  client->close();
  return 0;
}

int run_request(const Common& common, const std::string& subject, const std::string& message,
                double timeout_s, const std::vector<std::string>& header_options) {
  const rdmabroker::Headers headers = headers_or_die(header_options);
  auto client = connect_or_die(common);
  auto reply = client->request(
      subject, headers, rdmabroker::as_payload(message),
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s)));
  if (!reply) {
    // A refusal of the request's reply subscription comes as an ERROR that
    // the library reports after it woke the request with NO_RESPONDERS:
    // once a flush returns, every report of what came before it is in.
    (void)client->flush(std::chrono::seconds(5));
    // Distinct exit codes: scripts tell "nobody serves this" from "too slow"
    // and from "not allowed" (a refused request goes unanswered).
    const int code = reply.error().kind == rdmabroker::ErrorKind::kNoResponders ? kExitNoResponders
                     : reply.error().kind == rdmabroker::ErrorKind::kTimeout    ? kExitTimeout
                                                                                : kExitFailed;
    std::cerr << "rdmabroker: " << reply.error().message << "\n";
    return refused_or(code);
  }
  std::cout << reply->data() << "\n";
  client->close();
  return 0;
}

int run_reply(const Common& common, const std::string& subject, const std::string& queue,
              const std::string& message, std::uint64_t count) {
  auto [client, sub] = subscribe_or_die(common, subject, queue);
  std::cerr << "replying on " << subject << (queue.empty() ? "" : " in queue group " + queue) << "\n";
  std::uint64_t answered = 0;
  while ((count == 0 || answered < count) && !g_interrupted) {
    auto m = sub->next(std::chrono::milliseconds(200));
    if (!m) {
      if (m.error().kind == rdmabroker::ErrorKind::kTimeout) continue;
      return die(m.error());
    }
    if (m->reply.empty()) continue;  // a plain publish: nobody to answer
    if (auto st = client->publish(m->reply, message); !st) return die(st.error());
    ++answered;
    if (common.verbose) std::cerr << "answered " << m->subject << " -> " << m->reply << "\n";
  }
  if (auto st = client->flush(std::chrono::seconds(30)); !st) return die(st.error());
  client->close();
  return refused_or(0);
}

Subcommand add_pub(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message = "-";
    std::uint64_t count = 1;
    std::vector<std::string> headers;
    std::string file;
    bool ack = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("pub", "Publish a message (or each line of stdin with '-', or a file)");
  cmd->add_option("subject", a->subject, "Subject")->required();
  auto* message =
      cmd->add_option("message", a->message, "Message text, or - for stdin lines")->capture_default_str();
  cmd->add_option("-f,--file", a->file, "Publish this file's bytes as one message (-: all of stdin)")
      ->type_name("FILE")
      ->excludes(message);
  cmd->add_option("-n,--count", a->count, "Publish the message this many times")->capture_default_str();
  cmd->add_option("-H,--header", a->headers, "Add the message header NAME=VALUE (repeatable)")
      ->type_name("NAME=VALUE");
  cmd->add_flag(
      "--ack", a->ack,
      "Wait until a stream stored each message durably; print its stream and sequence (docs/streams.md)");
  add_common(cmd, a->common);
  return {cmd,
          [a] { return run_pub(a->common, a->subject, a->message, a->count, a->headers, a->file, a->ack); }};
}

Subcommand add_sub(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, queue;
    std::uint64_t count = 0;
    bool raw = false;
    double timeout = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("sub", "Subscribe and print messages, each with its headers");
  cmd->add_option("subject", a->subject, "Subject; * matches one token, > the rest")->required();
  cmd->add_option("-q,--queue", a->queue, "Join this queue group: each message goes to one member");
  cmd->add_option("-n,--count", a->count, "Exit after this many messages (0: run until interrupted)")
      ->capture_default_str();
  cmd->add_flag("--raw", a->raw, "Print only the payload (no subject, no headers)");
  cmd->add_option("--timeout", a->timeout, "Fail (exit 3) if not done after this many seconds");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_sub(a->common, a->subject, a->queue, a->count, a->raw, a->timeout); }};
}

Subcommand add_request(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message;
    double timeout = 5;
    std::vector<std::string> headers;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "request", "Send a request and print the first reply (exit 4: no responders, 3: timeout)");
  cmd->add_option("subject", a->subject, "Subject")->required();
  cmd->add_option("message", a->message, "Request text")->required();
  cmd->add_option("--timeout", a->timeout, "Seconds to wait for a reply")->capture_default_str();
  cmd->add_option("-H,--header", a->headers, "Add the request header NAME=VALUE (repeatable)")
      ->type_name("NAME=VALUE");
  add_common(cmd, a->common);
  return {cmd, [a] { return run_request(a->common, a->subject, a->message, a->timeout, a->headers); }};
}

Subcommand add_reply(CLI::App& app) {
  struct Args {
    Common common;
    std::string subject, message, queue;
    std::uint64_t count = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("reply", "Answer each request on SUBJECT with MESSAGE");
  cmd->add_option("subject", a->subject, "Subject (wildcards allowed)")->required();
  cmd->add_option("message", a->message, "Reply text")->required();
  cmd->add_option("-q,--queue", a->queue, "Join this queue group (responders share the requests)");
  cmd->add_option("-n,--count", a->count, "Exit after this many replies (0: run until interrupted)")
      ->capture_default_str();
  add_common(cmd, a->common);
  return {cmd, [a] { return run_reply(a->common, a->subject, a->queue, a->message, a->count); }};
}

}  // namespace
}  // namespace rdmabroker::cli

int main(int argc, char** argv) {
  using namespace rdmabroker::cli;
  std::signal(SIGINT, [](int) { g_interrupted = true; });
  std::signal(SIGTERM, [](int) { g_interrupted = true; });
  CLI::App app{"rdmabroker: publish, subscribe and inspect an rdmabrokerd broker"};
  app.set_version_flag("--version", std::string("rdmabroker ") + RDMABROKER_VERSION);
  app.require_subcommand(1);
  const Subcommand commands[] = {add_pub(app),     add_sub(app),    add_request(app), add_reply(app),
                                 add_consume(app), add_stream(app), add_bench(app),   add_stat(app),
                                 add_reload(app),  add_passwd(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too, with 0; a usage error with CLI11's
    // message and our one exit code for it (CLI11's own are 100 and more).
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  for (const auto& c : commands) {
    if (c.cmd->parsed()) return c.run();
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}
