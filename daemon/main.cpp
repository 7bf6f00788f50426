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

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "broker/broker.hpp"
#include "fault/fault.hpp"
#include "ops/admin_server.hpp"
#include "ops/logging.hpp"
#include "ops/memory_trim.hpp"
#include "ops/metrics.hpp"
#include "ops/rate_meter.hpp"
#include "ops/reloader.hpp"
#include "ops/systemd.hpp"
#include "rdmabroker/config/config.hpp"

namespace {

using namespace rdmabroker::daemon;
namespace config = rdmabroker::config;

/// Command-line flags override the file; each one given is remembered as a
/// setter, so a reload re-applies it over the freshly read file.
class Flags {
 public:
  template <typename T>
  void add(CLI::App& app, const std::string& name, const std::string& help, std::function<void(config::Config&, const T&)> set,
           CLI::Validator check = CLI::Validator()) {
    app.add_option_function<T>(
           name, [this, set](const T& v) { setters_.push_back([set, v](config::Config& c) { set(c, v); }); }, help)
        ->check(check)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  }
  void add_flag(CLI::App& app, const std::string& name, const std::string& help, std::function<void(config::Config&)> set) {
    app.add_flag_function(name, [this, set](std::int64_t) { setters_.push_back(set); }, help);
  }
  void apply(config::Config& c) const {
    for (const auto& s : setters_) s(c);
  }

 private:
  std::vector<std::function<void(config::Config&)>> setters_;
};

nlohmann::json connections_json(const std::vector<ConnectionInfo>& conns) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : conns) {
    list.push_back({{"id", c.id},
                    {"transport", c.transport},
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
                    {"pending_bytes", c.pending_bytes}});
  }
  return list;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rdmabrokerd: RDMA topic message broker"};
  std::string config_path;
  std::string check_path;
  bool check_only = false;
  app.add_option("-c,--config", config_path,
                 std::string("YAML configuration file (default ") + config::kDefaultConfigPath + " if it exists)");
  auto* check = app.add_option("--check-config", check_path, "Validate a configuration file (default: --config's) and exit")
                    ->expected(0, 1);
  Flags flags;
  using C = config::Config;
  flags.add<std::string>(app, "-a,--listen", "Address for RDMA (and TCP unless --tcp-listen); overrides listen.rdma's host",
                         [](C& c, const std::string& v) { c.broker.listen_address = v; });
  flags.add<std::uint16_t>(app, "-p,--port", "RDMA CM port", [](C& c, const std::uint16_t& v) { c.broker.port = v; });
  flags.add<std::string>(app, "--rdma", "auto, on or off", [](C& c, const std::string& v) {
    c.broker.rdma = v == "on" ? config::RdmaMode::kOn : v == "off" ? config::RdmaMode::kOff : config::RdmaMode::kAuto;
  }, CLI::IsMember({"auto", "on", "off"}));
  flags.add<std::string>(app, "--tcp-listen", "Address for the TCP listener",
                         [](C& c, const std::string& v) { c.broker.tcp_listen_address = v; });
  flags.add<std::uint16_t>(app, "--tcp-port", "TCP port (0: no TCP listener)",
                           [](C& c, const std::uint16_t& v) { c.broker.tcp_port = v; });
  flags.add<std::uint32_t>(app, "-w,--workers", "Worker threads (0: one per core, at most 8)",
                           [](C& c, const std::uint32_t& v) { c.broker.workers = v; });
  flags.add<std::uint32_t>(app, "--buffer-size", "Receive buffer size = largest frame",
                           [](C& c, const std::uint32_t& v) { c.broker.buffer_size = v; });
  flags.add<std::uint32_t>(app, "--pool-buffers", "Buffers in the registered pool",
                           [](C& c, const std::uint32_t& v) { c.broker.pool_buffers = v; });
  flags.add<std::uint32_t>(app, "--srq-depth", "Receives per SRQ", [](C& c, const std::uint32_t& v) { c.broker.srq_depth = v; });
  flags.add<std::uint32_t>(app, "--credits", "Receive credits granted to each RDMA client",
                           [](C& c, const std::uint32_t& v) { c.broker.credits = v; });
  flags.add<std::uint32_t>(app, "--max-inflight-sends", "Sends in flight per connection",
                           [](C& c, const std::uint32_t& v) { c.broker.max_inflight_sends = v; });
  flags.add<std::uint32_t>(app, "--busy-poll-us", "Spin on the CQs this long after the last work before sleeping (0: never)",
                           [](C& c, const std::uint32_t& v) { c.broker.busy_poll_us = v; });
  flags.add<std::uint64_t>(app, "--max-pending-bytes", "Bytes queued per subscriber before it is a slow consumer",
                           [](C& c, const std::uint64_t& v) { c.broker.max_pending_bytes = v; });
  flags.add<std::uint32_t>(app, "--write-deadline-ms", "Slow-consumer write deadline",
                           [](C& c, const std::uint32_t& v) { c.broker.write_deadline_ms = v; });
  flags.add<std::uint32_t>(app, "--producer-stall-ms", "How long publishers wait for a backlogged subscriber",
                           [](C& c, const std::uint32_t& v) { c.broker.producer_stall_ms = v; });
  flags.add<std::uint32_t>(app, "--max-connections", "Connection limit",
                           [](C& c, const std::uint32_t& v) { c.broker.max_connections = v; });
  flags.add<std::uint32_t>(app, "--max-subscriptions", "Subscriptions per connection",
                           [](C& c, const std::uint32_t& v) { c.broker.max_subscriptions = v; });
  flags.add<std::string>(app, "--admin-socket", "Unix socket for `rdmabroker stat`/`reload` (\"\": none)",
                         [](C& c, const std::string& v) { c.broker.admin_socket = v; });
  flags.add<std::string>(app, "--metrics-listen", "Prometheus endpoint host:port (\"\": none)",
                         [](C& c, const std::string& v) { c.metrics_listen = v; });
  flags.add_flag(app, "--allow-anonymous", "Accept clients without credentials (auth.anonymous: true)",
                 [](C& c) { c.broker.auth.anonymous = true; });
  flags.add<std::string>(app, "--log-level", "trace, debug, info, warn, error",
                         [](C& c, const std::string& v) { c.log.level = v; });
  CLI11_PARSE(app, argc, argv);
  check_only = check->count() > 0;

  // The file: --config, else the default path if present, else defaults only.
  if (config_path.empty() && std::filesystem::exists(config::kDefaultConfigPath)) config_path = config::kDefaultConfigPath;
  if (check_only) {
    const std::string path = !check_path.empty() ? check_path : config_path;
    auto c = read_config(path, nullptr);  // the file alone: flags are not part of what is checked
    if (!c) {
      std::cerr << c.error().message << "\n";
      return 1;
    }
    std::cout << (path.empty() ? std::string("(defaults)") : path) << ": ok\n";
    return 0;
  }
  const Reloader::Overrides overrides = [&flags](config::Config& c) { flags.apply(c); };
  auto loaded = read_config(config_path, overrides);
  if (!loaded) {
    std::cerr << "rdmabrokerd: " << loaded.error().message << "\n";
    return 1;
  }
  config::Config cfg = std::move(loaded.value());
  const std::string log_target = setup_logging(cfg.log);

  // Block the signals before any thread starts, so that only signalfd sees them.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  rdmabroker::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC));

  SystemdNotifier notifier;
  auto created = Broker::create(cfg.broker);
  if (!created) {
    spdlog::critical("cannot start: {}", created.error().message);
    notifier.status("failed: " + created.error().message);
    return 1;
  }
  auto& broker = *created.value();
  const auto& eff = broker.options();
  Reloader reloader(config_path, overrides, cfg, broker, notifier);
  auto counters = [&] {
    auto s = broker.stats();
    reloader.add_counters(s);
    return s;
  };
  RateMeter rates;  // main thread only
  MemoryTrimmer trimmer;

  std::unique_ptr<MetricsExporter> metrics;
  if (!cfg.metrics_listen.empty()) {
    auto m = MetricsExporter::start(cfg.metrics_listen, counters, [&] { return broker.histograms(); });
    if (!m) {
      spdlog::critical("cannot start: {}", m.error().message);
      return 1;
    }
    metrics = std::move(m.value());
  }

  std::unique_ptr<AdminServer> admin;
  if (!eff.admin_socket.empty()) {
    // The socket's directory (e.g. /run/rdmabroker) is created if missing;
    // under systemd, RuntimeDirectory= provides it.
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(eff.admin_socket).parent_path(), ec);
    admin = std::make_unique<AdminServer>(eff.admin_socket, [&](const std::string& cmd) {
      nlohmann::json reply;
      if (cmd == "stats") {
        auto s = counters();
        rates.add_rates(s);
        reply["ok"] = true;
        reply["stats"] = s;
      } else if (cmd == "connections") {
        reply["ok"] = true;
        reply["connections"] = connections_json(broker.connections());
      } else if (cmd == "reload") {
        const auto outcome = reloader.reload();
        reply["ok"] = outcome.ok;
        reply[outcome.ok ? "message" : "error"] = outcome.message;
        nlohmann::json changes = nlohmann::json::array();
        for (const auto& c : outcome.changes) changes.push_back({{"key", c.key}, {"from", c.from}, {"to", c.to}, {"live", c.live}});
        reply["changes"] = changes;
      } else if (cmd.starts_with("fault ") || cmd == "fault") {
        // Test builds only (fault/fault.hpp); elsewhere inject() says so.
        auto spec = fault::parse(std::string_view(cmd).substr(5));
        rdmabroker::Status st = spec ? broker.inject(spec.value()) : rdmabroker::Status(spec.error());
        reply["ok"] = st.ok();
        if (!st) reply["error"] = st.error().message;
      } else {
        reply["ok"] = false;
        reply["error"] = "unknown command '" + cmd + "' (known: stats, connections, reload)";
      }
      return reply.dump();
    });
    if (auto st = admin->open(); !st) {
      spdlog::critical("cannot start: {} (set admin.socket, or --admin-socket)", st.error().message);
      return 1;
    }
  }
  broker.start();
  const std::string where = broker.listeners();
  spdlog::info("rdmabrokerd {} listening on {} ({}{} workers, {} x {}-byte buffers; config {}; logging to {}{})",
               RDMABROKER_VERSION, where, broker.rdma_enabled() ? "" : "TCP only, ", eff.workers, eff.pool_buffers,
               eff.buffer_size, config_path.empty() ? "defaults" : config_path, log_target,
               cfg.metrics_listen.empty() ? "" : "; metrics on http://" + cfg.metrics_listen + "/metrics");
  notifier.ready("listening on " + where);

  // The watchdog is fed only while every worker loop is going round (each
  // wakes at least every 200 ms); a stuck worker lets systemd restart us.
  // The loop also wakes about once a second to sample rates for `stat`.
  const auto period = notifier.watchdog_period();
  const int poll_ms = period.count() > 0 ? static_cast<int>(std::min<std::int64_t>(period.count(), 1000)) : 1000;
  std::vector<pollfd> fds;
  while (true) {
    fds.assign(1, {sigfd.get(), POLLIN, 0});
    if (admin) admin->add_poll_fds(fds);
    const int n = ::poll(fds.data(), fds.size(), admin ? admin->timeout_ms(poll_ms) : poll_ms);
    if (period.count() > 0 && broker.workers_healthy(std::chrono::seconds(2))) notifier.watchdog();
    const auto now_stats = broker.stats();
    rates.sample(now_stats, std::chrono::steady_clock::now());
    trimmer.observe(now_stats.at("connections.current"));
    if (admin) admin->on_poll(fds.data() + 1, fds.size() - 1);  // also drops clients past their deadline
    if (n <= 0) continue;
    if (fds[0].revents != 0) {
      signalfd_siginfo si{};
      if (::read(sigfd.get(), &si, sizeof si) != sizeof si) continue;
      if (si.ssi_signo == SIGHUP) {
        reloader.reload();
        continue;
      }
      spdlog::info("{}: shutting down", strsignal(static_cast<int>(si.ssi_signo)));
      break;
    }
  }
  notifier.stopping();
  broker.stop();
  const auto s = broker.stats();
  spdlog::info("stopped: {} connections closed, {} messages in, {} delivered", s.at("connections.accepted"),
               s.at("messages.in"), s.at("messages.delivered"));
  return 0;
}
