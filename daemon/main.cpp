// rdmabrokerd: parses flags, starts the broker, and runs the main thread's
// loop: signals (SIGTERM/SIGINT stop) and the admin socket.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "broker/broker.hpp"
#include "ops/admin_server.hpp"

using rdmabroker::daemon::AdminServer;
using rdmabroker::daemon::Broker;
using rdmabroker::daemon::BrokerOptions;
using rdmabroker::daemon::RdmaMode;

int main(int argc, char** argv) {
  BrokerOptions opt;
  std::string log_level = "info";
  CLI::App app{"rdmabrokerd: RDMA topic message broker"};
  app.add_option("-a,--listen", opt.listen_address, "Address to listen on (RDMA, and TCP unless --tcp-listen)")->capture_default_str();
  app.add_option("-p,--port", opt.port, "RDMA CM port")->capture_default_str();
  app.add_option("--rdma", opt.rdma, "RDMA transport: auto (TCP only when no device exists), on (required), off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, RdmaMode>{
          {"auto", RdmaMode::kAuto}, {"on", RdmaMode::kOn}, {"off", RdmaMode::kOff}}))
      ->default_str("auto");
  app.add_option("--tcp-listen", opt.tcp_listen_address, "Address for the TCP listener (default: --listen)");
  app.add_option("--tcp-port", opt.tcp_port, "TCP port (0: no TCP listener)")->capture_default_str();
  app.add_option("-w,--workers", opt.workers, "Worker threads (0: one per core, at most 8)")->capture_default_str();
  app.add_option("--buffer-size", opt.buffer_size, "Receive buffer size in bytes = largest frame")->capture_default_str();
  app.add_option("--pool-buffers", opt.pool_buffers, "Buffers in the shared registered pool")->capture_default_str();
  app.add_option("--srq-depth", opt.srq_depth, "Receives per SRQ (one SRQ per worker and device)")->capture_default_str();
  app.add_option("--credits", opt.credits, "Receive credits granted to each client")->capture_default_str();
  app.add_option("--max-inflight-sends", opt.max_inflight_sends, "SENDs in flight per connection; more messages are batched")->capture_default_str();
  app.add_option("--max-pending-bytes", opt.max_pending_bytes, "Bytes queued per subscriber before it is disconnected as a slow consumer")->capture_default_str();
  app.add_option("--write-deadline-ms", opt.write_deadline_ms, "A subscriber with queued data that accepts nothing for this long is a slow consumer")->capture_default_str();
  app.add_option("--producer-stall-ms", opt.producer_stall_ms, "Credits withheld from a publisher feeding a backlogged subscriber, ms")->capture_default_str();
  app.add_option("--max-connections", opt.max_connections, "Connection limit")->capture_default_str();
  app.add_option("--max-subscriptions", opt.max_subscriptions, "Subscriptions per connection")->capture_default_str();
  app.add_option("--admin-socket", opt.admin_socket, "Unix socket for `rdmabroker stat`");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");

  // Block the signals before any thread starts, so that only signalfd sees them.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  rdmabroker::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC));

  auto created = Broker::create(opt);
  if (!created) {
    spdlog::critical("cannot start: {}", created.error().message);
    return 1;
  }
  auto& broker = *created.value();
  const auto& eff = broker.options();

  std::unique_ptr<AdminServer> admin;
  if (!eff.admin_socket.empty()) {
    admin = std::make_unique<AdminServer>(eff.admin_socket, [&](const std::string& cmd) {
      nlohmann::json reply;
      if (cmd == "stats") {
        reply["ok"] = true;
        reply["stats"] = broker.stats();
      } else {
        reply["ok"] = false;
        reply["error"] = "unknown command '" + cmd + "' (known: stats)";
      }
      return reply.dump();
    });
    if (auto st = admin->open(); !st) {
      spdlog::critical("cannot start: {}", st.error().message);
      return 1;
    }
  }
  broker.start();
  spdlog::info("rdmabrokerd listening on {} ({}{} workers, {} x {}-byte buffers)", broker.listeners(),
               broker.rdma_enabled() ? "" : "TCP only, ", eff.workers, eff.pool_buffers, eff.buffer_size);

  std::vector<pollfd> fds{{sigfd.get(), POLLIN, 0}};
  if (admin) fds.push_back({admin->fd(), POLLIN, 0});
  while (true) {
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents != 0) {
      signalfd_siginfo si{};
      if (::read(sigfd.get(), &si, sizeof si) != sizeof si) continue;
      if (si.ssi_signo == SIGHUP) {
        spdlog::info("SIGHUP: nothing to reload (configuration files are not supported by this version)");
        continue;
      }
      spdlog::info("{}: shutting down", strsignal(static_cast<int>(si.ssi_signo)));
      break;
    }
    if (admin && fds[1].revents != 0) admin->serve_one();
  }
  broker.stop();
  const auto s = broker.stats();
  spdlog::info("stopped: {} connections closed, {} messages in, {} delivered", s.at("connections.accepted"),
               s.at("messages.in"), s.at("messages.delivered"));
  return 0;
}
