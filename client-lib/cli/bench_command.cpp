// SPDX-License-Identifier: Apache-2.0
// `rdmabroker bench`: N publishers -> M subscribers through the broker, over
// the same measurement engine as the NATS and Redis drivers (bench.hpp).
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "admin_client.hpp"
#include "bench.hpp"
#include "commands.hpp"

namespace rdmabroker::cli {

namespace {

/// How `rdmabroker bench` uses the library beyond its ClientOptions.
struct EndpointMode {
  bool copy = false;  // subscribers take owning Messages (--copy)
  /// --polled: ClientOptions::polled. A subscriber is driven by a thread of
  /// the bench that calls poll(poll_timeout) (0: spins) until the end; a
  /// publisher polls once after each publish, on its own thread (credits
  /// and errors come in there), as a polled application's loop would.
  bool polled = false;
  std::chrono::microseconds poll_timeout{0};
};

/// `rdmabroker bench`'s connection: one librdmabroker client.
class BrokerEndpoint final : public rdmabroker::bench::BenchEndpoint {
 public:
  static std::unique_ptr<BenchEndpoint> connect(const std::string& url, const std::string& bind,
                                                const ClientOptions& base, const rdmabroker::Headers& headers,
                                                const EndpointMode& mode, std::string& error) {
    ClientOptions co = base;
    co.polled = mode.polled;
    co.bind_address = bind;
    co.publish_timeout = std::chrono::seconds(30);
    co.connect_timeout = std::chrono::seconds(15);
    auto c = Client::connect(url, co);
    if (!c) {
      error = c.error().message;
      return nullptr;
    }
    return std::unique_ptr<BenchEndpoint>(new BrokerEndpoint(std::move(c.value()), headers, mode));
  }
  std::string subscribe(const std::string& subject, const std::string& queue, OnPayload on_payload) override {
    // In place, the bench reads the payload and copies nothing; --copy: as
    // an owning Message.
    auto sid = mode_.copy
                   ? client_->queue_subscribe(subject, queue,
                                              [f = on_payload](const rdmabroker::Message& m) {
                                                f(rdmabroker::bench::Received(m.payload));
                                              })
                   : client_->queue_subscribe_view(
                         subject, queue, [f = on_payload](const rdmabroker::MessageView& m) {
                           f(rdmabroker::bench::Received(m.payload, m.received_at.time_since_epoch().count(),
                                                         m.relay_time.count()));
                         });
    if (!sid) return sid.error().message;
    start_polling();
    return flush(std::chrono::seconds(30));
  }
  std::string publish(const std::string& subject, std::span<const std::byte> payload, bool) override {
    // The library coalesces on its own: whatever is queued while a send is
    // in flight goes out together, an idle connection sends at once.
    auto st =
        headers_.empty() ? client_->publish(subject, payload) : client_->publish(subject, headers_, payload);
    if (!st) return st.error().message;
    if (mode_.polled && !poller_.joinable()) {
      if (auto polled = client_->poll(); !polled) return polled.error().message;
    }
    return {};
  }
  std::string flush(std::chrono::milliseconds timeout) override {
    auto st = client_->flush(timeout);
    return st ? std::string() : st.error().message;
  }
  std::string close() override {
    stop_polling();
    std::string why = client_->close_reason().message;
    client_->close();
    return why;
  }
  ~BrokerEndpoint() override { stop_polling(); }
  std::string describe() const override { return client_->transport_description(); }
  std::optional<std::uint64_t> wakeups() const override {
    const auto s = client_->stats();
    return s.io_wakeups + s.app_wakeups;
  }

 private:
  BrokerEndpoint(std::unique_ptr<Client> c, rdmabroker::Headers headers, const EndpointMode& mode)
      : client_(std::move(c)), headers_(std::move(headers)), mode_(mode) {}
  void start_polling() {
    if (!mode_.polled || poller_.joinable()) return;
    poller_ = std::thread([this] {
      // Until close(), or until the connection ends (the bench then sees its
      // messages missing and the close reason).
      while (!stop_polling_.load(std::memory_order_relaxed) && client_->poll(mode_.poll_timeout)) {
      }
    });
  }
  void stop_polling() {
    if (!poller_.joinable()) return;
    stop_polling_ = true;
    poller_.join();
  }
  std::unique_ptr<Client> client_;
  const rdmabroker::Headers headers_;  // on every message published (bench --header)
  const EndpointMode mode_;
  std::atomic<bool> stop_polling_{false};
  std::thread poller_;  // --polled: the thread that drives client_
};

}  // namespace

Subcommand add_bench(CLI::App& app) {
  struct Args {
    Common common;
    rdmabroker::bench::BenchOptions bench;
    std::uint32_t busy_poll_us = 0;
    ClientOptions client;
    std::string admin_socket;  // the broker's, to count its wake-ups too
    std::vector<std::string> headers;
    EndpointMode mode;
    std::uint32_t poll_timeout_us = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("bench", "Benchmark: publishers -> subscribers; rates, loss, reordering, latency");
  rdmabroker::bench::add_bench_options(*cmd, a->bench);
  cmd->add_option("--busy-poll-us", a->busy_poll_us,
                  "RDMA: each client's I/O thread spins on its CQ this long after a completion "
                  "(ClientOptions::busy_poll)")
      ->capture_default_str();
  cmd->add_flag("--adaptive-poll", a->client.adaptive_poll,
                "RDMA: each client spins before sleeping as long as its recent wake-ups say pays, up to "
                "--busy-poll-us (0: 200 us) (ClientOptions::adaptive_poll)");
  // A client holds (recv credits + in-flight + queued sends) buffers of the
  // broker's frame size: with very large frames, fewer of each.
  cmd->add_option("--recv-credits", a->client.recv_credits, "Receive buffers per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--recv-buffer-size", a->client.recv_buffer_size,
                  "Bytes per receive buffer (ClientOptions; below the broker's frame size, it cuts what it "
                  "sends to fit)")
      ->capture_default_str();
  cmd->add_flag("!--no-rendezvous", a->client.rendezvous, "RDMA: large messages as fragments, not offered");
  cmd->add_option("--inflight-sends", a->client.max_inflight_sends,
                  "Sends in flight per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--send-buffers", a->client.send_queue_buffers,
                  "Queued send buffers per client (ClientOptions)")
      ->capture_default_str();
  cmd->add_option("--admin-socket", a->admin_socket,
                  "The broker's admin socket: its wake-ups during the run are counted too (a broker on this "
                  "host)");
  cmd->add_option("-H,--header", a->headers,
                  "Publish every message with the header NAME=VALUE (repeatable): what headers cost")
      ->type_name("NAME=VALUE");
  cmd->add_flag("--copy", a->mode.copy,
                "Subscribers take each message as an owning Message (subscribe) instead of reading it in "
                "place (subscribe_view): what the copy costs");
  cmd->add_flag(
      "--polled", a->mode.polled,
      "Polled clients (ClientOptions::polled): no I/O thread; a thread of the bench per subscriber calls "
      "poll() until the end, each publisher polls after each publish");
  cmd->add_option(
         "--poll-timeout-us", a->poll_timeout_us,
         "With --polled: a subscriber's poll() waits this long when nothing has arrived (0: spins, a "
         "core per subscriber)")
      ->capture_default_str();
  add_common(cmd, a->common);
  return {cmd, [a] {
            const rdmabroker::Headers headers = headers_or_die(a->headers);
            a->bench.url = server_url(a->common);
            if (!a->admin_socket.empty()) {
              a->bench.broker_wakeups = [socket = a->admin_socket]() -> std::optional<std::uint64_t> {
                auto stats = rdmabroker::cli::admin_command(socket, "stats");
                if (!stats) return std::nullopt;
                std::uint64_t n = 0;
                for (const auto& [key, value] : (*stats)["stats"].items()) {
                  if (key.rfind("wakeups.", 0) == 0) n += value.get<std::uint64_t>();
                }
                return n;
              };
            }
            a->client.busy_poll = std::chrono::microseconds(a->busy_poll_us);
            a->mode.poll_timeout = std::chrono::microseconds(a->poll_timeout_us);
            a->common.set_credentials(a->client);
            return rdmabroker::bench::run_bench(
                a->bench, "rdmabroker", [a, headers](std::string& error, const std::string& url) {
                  return BrokerEndpoint::connect(url, a->common.bind, a->client, headers, a->mode, error);
                });
          }};
}

}  // namespace rdmabroker::cli
