// SPDX-License-Identifier: Apache-2.0
// rdmabrokerd: reads its configuration (YAML file + command line), starts the
// broker, and runs the main thread's loop: signals (SIGTERM/SIGINT stop,
// SIGHUP reloads), the admin socket (stats, connections, reload) and the
// systemd watchdog. Metrics are served by the exporter's own threads.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "admin_client.hpp"
#include "server.hpp"
#include "fault/fault.hpp"
#include "ops/admin_server.hpp"
#include "ops/command_line.hpp"
#include "ops/logging.hpp"
#include "ops/memory_trim.hpp"
#include "ops/metrics.hpp"
#include "ops/rate_meter.hpp"
#include "ops/reloader.hpp"
#include "stream/admin.hpp"
#include "ops/systemd.hpp"
#include "rdmabroker/config/config.hpp"

namespace {

using namespace rdmabroker::daemon;
namespace config = rdmabroker::config;

nlohmann::json connections_json(const std::vector<ConnectionInfo>& conns) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : conns) {
    list.push_back({{"id", c.id},
                    {"transport", c.transport},
                    {"version", c.version},
                    {"peer", c.peer},
                    {"state", c.state},
                    {"user", c.user},
                    {"worker", c.worker},
                    {"subscriptions", c.subscriptions},
                    {"messages_in", c.messages_in},
                    {"messages_out", c.messages_out},
                    {"bytes_in", c.bytes_in},
                    {"bytes_out", c.bytes_out},
                    {"pending_messages", c.pending_messages},
                    {"pending_bytes", c.pending_bytes},
                    {"credits", c.credits}});
    // Another broker's route here: which broker (SPEC.md §8).
    if (!c.route_broker.empty()) list.back()["broker"] = c.route_broker;
  }
  return list;
}

/// --check-config: the file alone is what is checked; the effective
/// listeners (flags applied) are printed so that an operator sees what would
/// be opened.
int check_config(const CommandLine& cl) {
  const std::string path = !cl.check_path.empty() ? cl.check_path : cl.config_path;
  auto file = read_file_config(path);
  if (!file) {
    std::cerr << file.error().message << "\n";
    return 1;
  }
  config::Config effective = file.value();
  cl.apply(effective);
  if (auto valid = config::validate(effective); !valid) {
    std::cerr << "with the command-line flags: " << valid.error().message << "\n";
    return 1;
  }
  // TLS files are part of the configuration: a key that does not load
  // would fail the start or the reload (run it as the broker's user to check
  // that it may read them).
  std::string tls;
  if (effective.broker.tls.mode != config::TlsMode::kOff) {
    auto ctx = TlsContext::build(effective.broker.tls);
    if (!ctx) {
      std::cerr << ctx.error().message << "\n";
      return 1;
    }
    tls = "tls " + std::string(config::to_string(effective.broker.tls.mode)) + ": " +
          ctx.value()->description();
  }
  std::cout << (path.empty() ? std::string("(defaults)") : path) << ": ok\n";
  if (!effective.broker.auth.anonymous && effective.broker.auth.users.empty())
    std::cerr << "warning: " << kNobodyCanConnect << "\n";
  for (const auto& l : describe_listeners(effective, cl, path)) std::cout << l << "\n";
  if (!tls.empty()) std::cout << tls << "\n";
  return 0;
}

/// --reload: the running broker reloads its file through its admin socket
/// (the unit's ExecReload, so `systemctl reload` waits for the outcome and
/// fails when the broker refused the new file).
int reload_running(const CommandLine& cl) {
  config::Config flags_only;
  cl.apply(flags_only);
  auto r = rdmabroker::cli::request_reload(flags_only.broker.admin_socket);
  if (!r) {
    std::cerr << "rdmabrokerd --reload: " << r.error().message << "\n";
    return 1;
  }
  std::cout << r.value() << "\n";
  return 0;
}

/// The main thread once the broker runs: signals, the admin socket, the
/// metrics endpoint (both PolledServers on its poll loop), rate sampling for
/// `stat`, memory trimming and the systemd watchdog.
class MainThread {
 public:
  MainThread(Server& broker, Reloader& reloader, const CommandLine& cl, std::vector<std::string> listeners)
      : broker_(broker), reloader_(reloader), cl_(cl), listeners_(std::move(listeners)) {}

  /// Opens the metrics endpoint and the admin socket (as configured).
  rdmabroker::Status open(const std::string& metrics_listen, const std::string& admin_socket) {
    if (!metrics_listen.empty()) {
      auto m = MetricsExporter::start(
          metrics_listen, [this](StatsVisitor& v) { visit_stats(v); },
          {[this] { return broker_.liveness(); }, [this] { return broker_.readiness(); }});
      if (!m) return m.error();
      metrics_ = std::move(m.value());
    }
    if (admin_socket.empty()) return {};
    // The socket's directory (e.g. /run/rdmabroker) is created if missing;
    // under systemd, RuntimeDirectory= provides it.
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(admin_socket).parent_path(), ec);
    admin_ =
        std::make_unique<AdminServer>(admin_socket, [this](const std::string& cmd) { return on_admin(cmd); });
    if (auto st = admin_->open(); !st) {
      return rdmabroker::Error{st.error().kind,
                               st.error().message + " (set admin.socket, or --admin-socket)"};
    }
    return {};
  }

  /// Runs until SIGTERM or SIGINT (SIGHUP reloads).
  void run(int sigfd, SystemdNotifier& notifier) {
    // The watchdog is fed only while every worker loop is going round (each
    // wakes at least every 200 ms); a stuck worker lets systemd restart us.
    // The loop also wakes about once a second to sample rates for `stat`.
    const auto period = notifier.watchdog_period();
    const int poll_ms =
        period.count() > 0 ? static_cast<int>(std::min<std::int64_t>(period.count(), 1000)) : 1000;
    std::vector<pollfd> fds;
    while (true) {
      // [signalfd][admin socket + its clients][metrics socket + its clients]
      fds.assign(1, {sigfd, POLLIN, 0});
      if (admin_) admin_->add_poll_fds(fds);
      const std::size_t metrics_at = fds.size();
      if (metrics_) metrics_->add_poll_fds(fds);
      int timeout = admin_ ? admin_->timeout_ms(poll_ms) : poll_ms;
      if (metrics_) timeout = metrics_->timeout_ms(timeout);
      const int n = ::poll(fds.data(), fds.size(), timeout);
      if (period.count() > 0 && broker_.workers_healthy()) notifier.watchdog();
      const auto now_stats = broker_.stats();
      rates_.sample(now_stats, std::chrono::steady_clock::now());
      std::int64_t closed = now_stats.at("connections.rejected");
      for (auto it = now_stats.lower_bound("connections.closed.");
           it != now_stats.end() && it->first.starts_with("connections.closed."); ++it)
        closed += it->second;
      trimmer_.observe(now_stats.at("connections.current"), closed, now_stats.at("messages.pending_bytes"));
      // Both also drop clients past their deadline.
      if (admin_) admin_->on_poll(fds.data() + 1, metrics_at - 1);
      if (metrics_) metrics_->on_poll(fds.data() + metrics_at, fds.size() - metrics_at);
      if (n <= 0 || fds[0].revents == 0) continue;
      signalfd_siginfo si{};
      if (::read(sigfd, &si, sizeof si) != sizeof si) continue;
      if (si.ssi_signo == SIGHUP) {
        reloader_.reload();
        continue;
      }
      spdlog::info("{}: shutting down", strsignal(static_cast<int>(si.ssi_signo)));
      return;
    }
  }

 private:
  /// Every statistic: the broker's and the reloader's.
  void visit_stats(StatsVisitor& v) const {
    broker_.visit_stats(v);
    reloader_.visit_stats(v);
  }

  std::string on_admin(const std::string& cmd) {
    nlohmann::json reply;
    if (cmd == "stats") {
      StatsSnapshotter s;
      visit_stats(s);
      rates_.add_rates(s.snapshot);
      reply["ok"] = true;
      reply["stats"] = s.snapshot;
      reply["config"] = {{"file", cl_.config_origin}, {"listeners", listeners_}};
      nlohmann::json routes = nlohmann::json::array();
      for (const auto& r : broker_.routes()) {
        routes.push_back({{"url", r.url},
                          {"state", to_string(r.state)},
                          {"broker", r.broker},
                          {"discovered", r.discovered},
                          {"interest", r.interest},
                          {"messages_in", r.messages_in},
                          {"bytes_in", r.bytes_in},
                          {"dropped", r.dropped},
                          {"reconnects", r.reconnects}});
      }
      reply["routes"] = routes;
    } else if (cmd == "connections") {
      reply["ok"] = true;
      reply["connections"] = connections_json(broker_.connections());
    } else if (cmd == "reload") {
      const auto outcome = reloader_.reload();
      reply["ok"] = outcome.ok;
      reply[outcome.ok ? "message" : "error"] = outcome.message;
      nlohmann::json changes = nlohmann::json::array();
      for (const auto& c : outcome.changes)
        changes.push_back({{"key", c.key}, {"from", c.from}, {"to", c.to}, {"live", c.live}});
      reply["changes"] = changes;
      reply["overridden"] = outcome.overridden;
    } else if (cmd.starts_with("stream ") || cmd == "stream") {
      return stream_admin(broker_.streams(), std::string_view(cmd).substr(6));
    } else if (cmd.starts_with("fault ") || cmd == "fault") {
      // Test builds only (fault/fault.hpp); elsewhere inject() says so.
      auto spec = fault::parse(std::string_view(cmd).substr(5));
      rdmabroker::Status st = spec ? broker_.inject(spec.value()) : rdmabroker::Status(spec.error());
      reply["ok"] = st.ok();
      if (!st) reply["error"] = st.error().message;
    } else {
      reply["ok"] = false;
      reply["error"] = "unknown command '" + cmd + "' (known: stats, connections, reload, stream)";
    }
    return reply.dump();
  }

  Server& broker_;
  Reloader& reloader_;
  const CommandLine& cl_;
  const std::vector<std::string> listeners_;
  RateMeter rates_;  // main thread only
  MemoryTrimmer trimmer_;
  std::unique_ptr<MetricsExporter> metrics_;
  std::unique_ptr<AdminServer> admin_;
};

/// Blocks the signals before any thread starts, so that only the returned
/// signalfd sees them.
rdmabroker::UniqueFd block_signals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return rdmabroker::UniqueFd(signalfd(-1, &mask, SFD_CLOEXEC));
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parse_command_line(argc, argv);
  if (auto* exit = std::get_if<CommandLineExit>(&parsed)) {
    (exit->code == 0 ? std::cout : std::cerr) << exit->text;
    return exit->code;
  }
  const CommandLine& cl = std::get<CommandLine>(parsed);
  if (cl.check_only) return check_config(cl);
  if (cl.reload_only) return reload_running(cl);
  const std::string config_path = cl.config_path;
  auto loaded = read_file_config(config_path);
  if (!loaded) {
    std::cerr << "rdmabrokerd: " << loaded.error().message << "\n";
    return 1;
  }
  const config::Config file_cfg = loaded.value();
  cl.apply(loaded.value());
  config::Config cfg = std::move(loaded.value());
  const std::string log_target = setup_logging(cfg.log);
  rdmabroker::UniqueFd sigfd = block_signals();

  SystemdNotifier notifier;
  auto fail = [&](const std::string& why) {
    spdlog::critical("cannot start: {}", why);
    notifier.status("failed: " + why);
    return 1;
  };
  // The file was checked as it was read; the flags applied over it must
  // keep the rules that tie settings together too.
  if (auto valid = config::validate(cfg); !valid)
    return fail("with the command-line flags: " + valid.error().message);
  auto created = Server::create(cfg.broker);
  if (!created) return fail(created.error().message);
  auto& broker = *created.value();
  const auto& eff = broker.options();
  Reloader reloader(config_path, cl, file_cfg, cfg, broker, notifier);
  MainThread main_thread(broker, reloader, cl, describe_listeners(cfg, cl, config_path));
  if (auto st = main_thread.open(cfg.metrics_listen, eff.admin_socket); !st) return fail(st.error().message);
  broker.start();
  const std::string where = broker.listeners();
  spdlog::info(
      "rdmabrokerd {} listening on {} ({}{} workers, {} x {}-byte buffers; config file {}; logging to {}{})",
      RDMABROKER_VERSION, where, broker.rdma_enabled() ? "" : "TCP only, ", eff.workers, eff.pool_buffers,
      eff.buffer_size, cl.config_origin, log_target,
      cfg.metrics_listen.empty() ? "" : "; metrics on http://" + cfg.metrics_listen + "/metrics");
  notifier.ready("listening on " + where);
  main_thread.run(sigfd.get(), notifier);
  notifier.stopping();
  broker.stop();
  const auto s = broker.stats();
  spdlog::info("stopped: {} connections closed, {} messages in, {} delivered", s.at("connections.accepted"),
               s.at("messages.in"), s.at("messages.delivered"));
  return 0;
}
