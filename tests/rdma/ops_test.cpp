// SPDX-License-Identifier: Apache-2.0
// Operating the broker as an operator does: live reload from the YAML file
// (applied, refused, invalid; by `rdmabroker reload` and by SIGHUP), the
// Prometheus endpoint checked by promtool on a live scrape, and `rdmabroker
// stat` listing connections with their transport. Each runs with clients on
// RDMA (in the guest, label rdma) and on TCP (on the host, label tcp).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"
#include "rdmabroker/common/fd.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;

class Ops : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
  std::unique_ptr<Client> connect(const BrokerProcess& b, std::vector<Error>* errors = nullptr,
                                  std::mutex* mu = nullptr) {
    ClientOptions opt;
    if (errors != nullptr) {
      opt.on_error = [errors, mu](const Error& e) {
        std::lock_guard l(*mu);
        errors->push_back(e);
      };
    }
    return connect_via(b, GetParam(), opt);
  }
  std::string config_path_ = "/tmp/rdmabroker-ops-" + std::to_string(getpid()) + ".yaml";
};

TEST_P(Ops, ReloadAppliesLiveSettingsRefusesTheRestAndKeepsClients) {
  write_file(config_path_, "logging: {level: info}\nlimits: {max_subscriptions: 100}\n");
  BrokerProcess broker(next_port(), {"--config", config_path_});
  ASSERT_TRUE(broker.running());
  std::mutex mu;
  std::vector<Error> errors;
  auto client = connect(broker, &errors, &mu);
  ASSERT_TRUE(client);
  auto sub = client->subscribe(std::string_view("ops.a"));
  ASSERT_TRUE(sub);
  ASSERT_TRUE(client->flush(10s));
  auto reload = [&] { return run({cli_path(), "reload", "--admin-socket", broker.admin_socket()}); };

  // 1. Live changes: applied, reported, in force for what follows.
  write_file(config_path_, "logging: {level: debug}\nlimits: {max_subscriptions: 2}\n");
  auto [rc, out] = reload();
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("logging.level info -> debug"), std::string::npos) << out;
  EXPECT_NE(out.find("limits.max_subscriptions 100 -> 2"), std::string::npos) << out;
  ASSERT_TRUE(client->subscribe(std::string_view("ops.b")));
  ASSERT_TRUE(client->subscribe(std::string_view("ops.c")));  // the third: over the new limit
  ASSERT_TRUE(client->flush(10s));
  {
    std::lock_guard l(mu);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].message.find("too many subscriptions"), std::string::npos) << errors[0].message;
  }

  // 2. An invalid file: refused with the position of the mistake; nothing changes.
  write_file(config_path_, "logging: {level: debug}\nlimits: {max_subscriptions: lots}\n");
  auto bad = run({cli_path(), "reload", "--admin-socket", broker.admin_socket()});
  EXPECT_EQ(bad.first, 1);

  // 3. A change that needs a restart: refused, naming it.
  write_file(config_path_,
             "logging: {level: debug}\nlimits: {max_subscriptions: 2}\nbuffers: {size: 8KiB}\n");
  auto fixed = reload();
  EXPECT_EQ(fixed.first, 1);

  // 4. SIGHUP reloads too (back to the first file).
  write_file(config_path_, "logging: {level: info}\nlimits: {max_subscriptions: 100}\n");
  ASSERT_EQ(::kill(broker.pid(), SIGHUP), 0);
  auto s = broker.wait_stats([](auto& s) { return s["reloads.ok"] == 2; }, 10s);
  EXPECT_EQ(s["reloads.ok"], 2);
  EXPECT_EQ(s["reloads.failed"], 1);
  EXPECT_EQ(s["reloads.refused"], 1);

  // The client was never disturbed: connected, and messages still flow.
  EXPECT_TRUE(client->close_reason().message.empty()) << client->close_reason().message;
  EXPECT_EQ(s["connections.current"], 1);
  ASSERT_TRUE(client->publish("ops.a", std::string_view("after reloads")));
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after reloads");
  ::unlink(config_path_.c_str());
}

// Each limit answers with its own error to that client only, and is counted
// by limit (rdmabroker_limit_refusals_total{limit}).
TEST_P(Ops, LimitsAreEnforcedWithAClearErrorAndCounted) {
  BrokerProcess broker(next_port(), {"--max-connections", "2", "--max-subscriptions", "2"});
  ASSERT_TRUE(broker.running());
  std::mutex mu;
  std::vector<Error> errors;
  auto a = connect(broker, &errors, &mu);
  auto b = connect(broker);
  ASSERT_TRUE(a && b);
  auto third = try_connect_via(broker, GetParam());
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().kind, ErrorKind::kRejected);
  EXPECT_NE(third.error().message.find("connection limit reached"), std::string::npos)
      << third.error().message;

  ASSERT_TRUE(a->subscribe(std::string_view("lim.1")));
  ASSERT_TRUE(a->subscribe(std::string_view("lim.2")));
  ASSERT_TRUE(a->subscribe(std::string_view("lim.3")));
  ASSERT_TRUE(a->flush(10s));
  {
    std::lock_guard l(mu);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].message.find("too many subscriptions"), std::string::npos) << errors[0].message;
  }
  auto s = broker.stats();
  EXPECT_EQ(s["limits.refused.connections"], 1);
  EXPECT_EQ(s["limits.refused.subscriptions"], 1);
  EXPECT_EQ(s["subscriptions"], 2);
  EXPECT_EQ(s["connections.current"], 2);
  // Both admitted clients still work.
  auto sub = b->subscribe(std::string_view("lim.ok"));
  ASSERT_TRUE(sub && b->flush(10s));
  ASSERT_TRUE(a->publish("lim.ok", std::string_view("fine")));
  auto m = sub.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
}

TEST_P(Ops, InvalidReloadExplainsWhereAndWhy) {
  write_file(config_path_, "workers: 2\n");
  BrokerProcess broker(next_port(), {"--config", config_path_});
  ASSERT_TRUE(broker.running());
  write_file(config_path_, "workers: 2\nlimits:\n  max_subscriptions: lots\n");
  auto [rc, out] =
      run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker.admin_socket() + " 2>&1"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find(config_path_ + ":3:22: limits.max_subscriptions: expected an integer"),
            std::string::npos)
      << out;
  write_file(config_path_, "workers: 3\n");
  auto refused =
      run({"/bin/sh", "-c", cli_path() + " reload --admin-socket " + broker.admin_socket() + " 2>&1"});
  EXPECT_EQ(refused.first, 1);
  EXPECT_NE(refused.second.find("workers changed (2 -> 3) and cannot change while running"),
            std::string::npos)
      << refused.second;
  ::unlink(config_path_.c_str());
}

TEST_P(Ops, MetricsPassPromtoolOnALiveScrape) {
  const std::uint16_t metrics_port = next_port();
  // A stream, so that its series (labelled by it) are there for the dashboard's panels.
  const std::string streams = "/tmp/rdmabroker-metrics-" + std::to_string(getpid());
  const std::string config = streams + ".yaml";
  write_file(config, "storage: {directory: " + streams + "}\nstreams: [{name: M, subjects: [m.stored]}]\n");
  BrokerProcess broker(next_port(),
                       {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port), "--config", config});
  ASSERT_TRUE(broker.running());
  auto sub_client = connect(broker);
  auto pub = connect(broker);
  ASSERT_TRUE(sub_client && pub);
  std::atomic<int> got{0};
  ASSERT_TRUE(sub_client->subscribe("m.x", [&](const Message&) { got.fetch_add(1); }));
  ASSERT_TRUE(sub_client->flush(10s));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(pub->publish("m.x", std::string_view("hello")));
  ASSERT_TRUE(pub->publish_acked("m.stored", "kept", 10s));
  ASSERT_TRUE(pub->flush(10s));
  ASSERT_TRUE(broker.wait_stats([](auto& s) { return s["messages.delivered"] == 100; },
                                10s)["messages.delivered"] == 100);

  const std::string body = http_get(metrics_port, "/metrics");
  ASSERT_FALSE(body.empty());
  const std::string file = "/tmp/rdmabroker-metrics-" + std::to_string(getpid()) + ".txt";
  write_file(file, body);
  auto [rc, out] = run({"/bin/sh", "-c", "promtool check metrics < " + file + " 2>&1"});
  EXPECT_EQ(rc, 0) << out;
  const std::string via = to_string(GetParam());
  EXPECT_NE(body.find("rdmabroker_connections{transport=\"" + via + "\"} 2"), std::string::npos) << body;
  EXPECT_NE(body.find("rdmabroker_messages_received_total 101"), std::string::npos)
      << "100 and the stored one";
  EXPECT_NE(body.find("rdmabroker_messages_delivered_total 100"), std::string::npos);
  EXPECT_NE(body.find("rdmabroker_subscriptions 1"), std::string::npos);
  EXPECT_NE(body.find("rdmabroker_messages_dropped_total{reason=\"slow_consumer\"} 0"), std::string::npos);
  EXPECT_NE(body.find("rdmabroker_relay_latency_seconds_count"), std::string::npos);
  EXPECT_EQ(body.find("rdmabroker_relay_latency_seconds_count 0"), std::string::npos)
      << "no latency observed";
  EXPECT_NE(body.find("rdmabroker_build_info{version=\""), std::string::npos);
  EXPECT_NE(body.find("rdmabroker_stream_messages{stream=\"M\"} 1"), std::string::npos) << body;
  if (GetParam() == Via::kRdma) {
    EXPECT_EQ(body.find("rdmabroker_completions_per_poll_count 0"), std::string::npos)
        << "no completion observed";
  }
  // No subject or client id ever becomes a label.
  EXPECT_EQ(body.find("m.x"), std::string::npos);
  // Every metric the shipped dashboard and alerts use is one the broker serves.
  for (const char* file :
       {"deploy/grafana/rdmabroker-dashboard.json", "deploy/prometheus/rdmabroker-alerts.yml"}) {
    std::ifstream in(source_dir() + "/" + file);
    ASSERT_TRUE(in) << file;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::smatch m;
    for (auto it = text.cbegin(); std::regex_search(it, text.cend(), m, std::regex("rdmabroker_[a-z_]+"));
         it = m.suffix().first) {
      std::string name = std::regex_replace(m.str(), std::regex("_(bucket|sum|count)$"), "");
      // A route's series exist only on a broker of a cluster (one per
      // route, labelled by it): this broker has none.
      if (name.starts_with("rdmabroker_route_")) continue;
      EXPECT_NE(body.find("# TYPE " + name + " "), std::string::npos) << file << " uses " << m.str();
    }
  }
  ::unlink(file.c_str());
  ::unlink(config.c_str());
  std::filesystem::remove_all(streams);
}

// A client whose broker went away keeps its Client object until the
// application closes it; meanwhile its I/O thread must sleep, not spin on the
// dead connection (a process holding many such clients would burn every core).
TEST_P(Ops, ClientWhoseBrokerLeftUsesNoCpu) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto a = connect(broker);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->subscribe(std::string_view("s.gone")));
  ASSERT_TRUE(a->flush(10s));
  ASSERT_EQ(broker.stop(SIGTERM, 10s), 0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (a->close_reason().message.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(a->close_reason().message.empty()) << "the client did not notice the broker leaving";
  auto cpu_seconds = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  const double before = cpu_seconds();
  std::this_thread::sleep_for(1s);
  // A spinning I/O thread would have used about a second of CPU here.
  EXPECT_LT(cpu_seconds() - before, 0.2);
  a->close();
}

/// CPU seconds (user + system) process `pid` has used so far.
double process_cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  // Fields after the command name (which may hold spaces): utime and stime
  // are the 12th and 13th of them.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i >= 12) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// After traffic, a broker whose clients stay connected but quiet sleeps: a
// worker that found work to flush on every turn would never sleep, and
// would burn a core per worker with nothing to do.
TEST_P(Ops, AnIdleBrokerWithClientsUsesNoCpu) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto sub = connect(broker);
  auto pub = connect(broker);
  ASSERT_TRUE(sub && pub);
  std::atomic<int> received{0};
  ASSERT_TRUE(sub->subscribe("idle.x", [&](const Message&) { received.fetch_add(1); }));
  ASSERT_TRUE(sub->flush(10s));
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(pub->publish("idle.x", std::to_string(i)));
  ASSERT_TRUE(pub->flush(10s));
  ASSERT_TRUE(wait_until([&] { return received.load() == 200; }, 30s)) << received.load();
  std::this_thread::sleep_for(300ms);  // the last credits and completions settle
  const double before = process_cpu_seconds(broker.pid());
  std::this_thread::sleep_for(1s);
  // Two workers spinning would have used about two seconds here.
  EXPECT_LT(process_cpu_seconds(broker.pid()) - before, 0.2);
}

TEST_P(Ops, StatListsConnectionsWithTheirTransport) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto a = connect(broker);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->subscribe(std::string_view("s.one")));
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(a->publish("s.none", std::string_view("1234")));
  ASSERT_TRUE(a->flush(10s));
  auto [rc, out] = run({cli_path(), "stat", "--json", "--admin-socket", broker.admin_socket()});
  ASSERT_EQ(rc, 0) << out;
  auto doc = nlohmann::json::parse(out);
  ASSERT_EQ(doc["connections"].size(), 1u) << out;
  const auto& c = doc["connections"][0];
  EXPECT_EQ(c["transport"], to_string(GetParam()));
  EXPECT_EQ(c["state"], "established");
  EXPECT_EQ(c["subscriptions"], 1);
  EXPECT_EQ(c["messages_in"], 7);
  EXPECT_EQ(c["bytes_in"], 28);
  EXPECT_EQ(doc["stats"]["messages.in"], 7);
  auto text = run({cli_path(), "stat", "--admin-socket", broker.admin_socket()});
  EXPECT_NE(text.second.find("1 connection(s)"), std::string::npos) << text.second;
  // Rates: traffic for a few seconds shows up as messages per second.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(a->publish("s.none", std::string_view("1234")));
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(a->flush(10s));
  auto busy = nlohmann::json::parse(
      run({cli_path(), "stat", "--json", "--admin-socket", broker.admin_socket()}).second);
  EXPECT_GT(busy["stats"]["rates.messages_in_per_s"].get<std::int64_t>(), 10) << busy["stats"].dump();
  EXPECT_GT(busy["stats"]["rates.bytes_in_per_s"].get<std::int64_t>(), 40);
}

/// A raw connection to the admin socket.
UniqueFd admin_connect(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fd.reset();
  return fd;
}

/// What the broker writes back before it closes (waits up to `timeout`).
std::string read_reply(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

TEST_P(Ops, AdminSocketMisuseGetsAnErrorAndHarmsNobody) {
  BrokerProcess broker(next_port());
  ASSERT_TRUE(broker.running());
  auto sub = connect(broker);
  auto pub = connect(broker);
  ASSERT_TRUE(sub && pub);
  std::atomic<int> got{0};
  ASSERT_TRUE(sub->subscribe("admin.t", [&](const Message&) { got.fetch_add(1); }));
  ASSERT_TRUE(sub->flush(10s));
  const std::size_t baseline_fds = open_fds(broker.pid());

  // Clients that connect and say nothing, or half a command: the admin
  // socket is served on the broker's main thread, and none of them may hold
  // it: a well-behaved `stats` gets its answer meanwhile.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(admin_connect(broker.admin_socket()));
  ASSERT_EQ(::send(idle.back().get(), "sta", 3, MSG_NOSIGNAL), 3);
  EXPECT_GT(broker.stats()["connections.current"], 0);

  auto ask = [&](const std::string& bytes) {
    UniqueFd fd = admin_connect(broker.admin_socket());
    EXPECT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    return read_reply(fd.get(), 10s);
  };
  EXPECT_NE(ask(std::string(5000, 'a')).find("longer than 4096"), std::string::npos);
  EXPECT_NE(ask(std::string("\x01\x02\xff\n", 4)).find("printable ASCII"), std::string::npos);
  EXPECT_NE(ask("hello\n").find("unknown command"), std::string::npos);
  const std::string fault = ask("fault bogus 1\n");  // unknown fault, or not built in
  EXPECT_NE(fault.find("\"ok\":false"), std::string::npos) << fault;
  {
    // Asks and leaves without reading the answer.
    UniqueFd fd = admin_connect(broker.admin_socket());
    ASSERT_EQ(::send(fd.get(), "connections\n", 12, MSG_NOSIGNAL), 12);
  }
  // More clients than the broker serves at once: the extra ones are told so.
  std::vector<UniqueFd> crowd;
  for (int i = 0; i < 20; ++i) crowd.push_back(admin_connect(broker.admin_socket()));
  int refused = 0;
  for (auto& fd : crowd) {
    if (read_reply(fd.get(), 200ms).find("too many admin clients") != std::string::npos) ++refused;
  }
  EXPECT_GT(refused, 0);
  crowd.clear();

  // The data path never noticed.
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(pub->publish("admin.t", std::string_view("x")));
  ASSERT_TRUE(pub->flush(10s));
  EXPECT_TRUE(sub->flush(10s));
  EXPECT_EQ(got.load(), 200);

  // A silent client is dropped at its deadline; then every descriptor is back.
  EXPECT_EQ(read_reply(idle.front().get(), 15s), "");  // EOF, not a reply
  idle.clear();
  std::size_t fds = 0;
  for (int i = 0; i < 100 && (fds = open_fds(broker.pid())) != baseline_fds; ++i)
    std::this_thread::sleep_for(100ms);
  EXPECT_EQ(fds, baseline_fds);
  EXPECT_NE(broker.admin("stats").find("\"ok\":true"), std::string::npos);
}

// The probes an orchestrator or a load balancer asks, on the metrics
// listener: /healthz (the worker loops go round) and /readyz (that, plus
// listening and every RDMA device's port up). Each answers 200 and says what
// it checked; only GET is served.
TEST_P(Ops, HealthAndReadinessProbesSayWhatTheyChecked) {
  const std::uint16_t metrics_port = next_port();
  BrokerProcess broker(next_port(),
                       {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port), "--workers", "2"});
  ASSERT_TRUE(broker.running());
  auto client = connect(broker);
  ASSERT_TRUE(client);
  HttpReply live, ready;
  // A loop that has not gone round for 2 s fails the probe (as it stops the
  // watchdog); under emulation a sanitized worker can be that late once.
  EXPECT_TRUE(wait_until([&] { return (live = http_request(metrics_port, "/healthz")).status == 200; }, 20s))
      << live.status << " " << live.body;
  EXPECT_EQ(live.body, "[+]workers ok: 2 worker loops went round within 2 s\nok\n");
  EXPECT_TRUE(wait_until([&] { return (ready = http_request(metrics_port, "/readyz")).status == 200; }, 20s))
      << ready.status << " " << ready.body;
  EXPECT_NE(ready.body.find("[+]workers ok: "), std::string::npos) << ready.body;
  EXPECT_NE(ready.body.find("[+]listeners ok: "), std::string::npos) << ready.body;
  EXPECT_NE(ready.body.find("tcp://"), std::string::npos) << ready.body;
  EXPECT_NE(ready.body.find(":" + std::to_string(broker.tcp_port())), std::string::npos) << ready.body;
  if (GetParam() == Via::kRdma) {
    EXPECT_NE(ready.body.find("rdma://"), std::string::npos) << ready.body;
    // Both guest devices, each with its port's state.
    for (const char* dev : {"rxe0: port 1 active", "rxe1: port 1 active"})
      EXPECT_NE(ready.body.find(dev), std::string::npos) << ready.body;
  } else {
    EXPECT_NE(ready.body.find("[+]devices ok: no RDMA device served (TCP only)"), std::string::npos)
        << ready.body;
  }
  EXPECT_TRUE(ready.body.ends_with("\nok\n")) << ready.body;
  EXPECT_EQ(http_request(metrics_port, "/healthz?verbose").status, 200);  // a query is ignored
  const auto post = http_request(metrics_port, "/readyz", 10s, "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.body, "GET or HEAD /readyz\n");
  // HEAD, as load balancers probe: the status alone, no body.
  for (const char* path : {"/healthz", "/readyz", "/metrics"}) {
    const auto head = http_request(metrics_port, path, 10s, "HEAD");
    EXPECT_EQ(head.status, 200) << path;
    EXPECT_EQ(head.body, "") << path;
  }
  EXPECT_EQ(http_request(metrics_port, "/livez").status, 404);
  // The client was served all along.
  ASSERT_TRUE(client->flush(10s));
}

// A Soft-RoCE device of the test's own on a veth pair of its own, so that
// taking its link down disturbs no other device (the guest runs as root).
// Removed at the end, after the broker that used it has stopped.
struct ThrowawayRxe {
  static constexpr const char* kDevice = "rxe_probe";
  static constexpr const char* kLink = "rbprobe0";
  ThrowawayRxe() {
    auto [rc, out] = run(
        {"/bin/sh", "-c",
         "PATH=/usr/sbin:/usr/bin:/sbin:/bin; (rdma link delete rxe_probe; ip link del rbprobe0) 2>/dev/null;"
         "ip link add rbprobe0 type veth peer name rbprobe1 && ip link set rbprobe1 up &&"
         " ip link set rbprobe0 up && rdma link add rxe_probe type rxe netdev rbprobe0 2>&1"});
    made = rc == 0;
    why = out;
  }
  ~ThrowawayRxe() {
    run({"/bin/sh", "-c",
         "PATH=/usr/sbin:/usr/bin:/sbin:/bin; rdma link delete rxe_probe; ip link del rbprobe0"});
  }
  bool link(bool up) const { return run({"/sbin/ip", "link", "set", kLink, up ? "up" : "down"}).first == 0; }
  bool made = false;
  std::string why;
};

// /readyz follows the state of the ports of the devices the broker serves:
// a link that goes down makes the broker not ready (its clients there are
// stranded), naming the device and the port state; back up, ready again.
// Liveness does not change: a restart would not bring a link up.
TEST(Health, ReadinessFollowsThePortStateOfTheBrokersDevices) {
  require_rdma();
  ThrowawayRxe dev;
  ASSERT_TRUE(dev.made) << dev.why;
  const std::string config = "/tmp/rdmabroker-health-" + std::to_string(getpid()) + ".yaml";
  write_file(config, "devices: [rxe_probe]\n");
  const std::uint16_t metrics_port = next_port();
  BrokerProcess broker(next_port(),
                       {"--config", config, "--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(broker.running());
  HttpReply ready;
  auto ready_is = [&](int status) {
    return wait_until([&] { return (ready = http_request(metrics_port, "/readyz", 2s)).status == status; },
                      20s);
  };
  ASSERT_TRUE(ready_is(200)) << ready.status << " " << ready.body;
  EXPECT_NE(ready.body.find("[+]devices ok: rxe_probe: port 1 active"), std::string::npos) << ready.body;

  ASSERT_TRUE(dev.link(false));
  ASSERT_TRUE(ready_is(503)) << ready.status << " " << ready.body;
  EXPECT_NE(ready.body.find("[-]devices failed: rxe_probe: port 1 down"), std::string::npos) << ready.body;
  EXPECT_TRUE(ready.body.ends_with("readyz check failed\n")) << ready.body;
  EXPECT_EQ(http_request(metrics_port, "/healthz").status, 200);

  ASSERT_TRUE(dev.link(true));
  ASSERT_TRUE(ready_is(200)) << ready.status << " " << ready.body;
  EXPECT_NE(ready.body.find("rxe_probe: port 1 active"), std::string::npos) << ready.body;
  std::remove(config.c_str());
}

// Whoever reaches the admin socket may reload the broker and manage its
// streams: the broker will not serve it from a directory every user may
// write to (another user could put a socket of their own in its place).
TEST(Tcp, AnAdminSocketInADirectoryEveryUserMayWriteToStopsTheStart) {
  const std::string dir = "/tmp/rdmabroker-open-dir-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0777);  // writable by all, not sticky
  auto [rc, out] =
      run({broker_path(), "--allow-anonymous", "--rdma", "off", "--tcp-port", std::to_string(next_port()),
           "--admin-socket", dir + "/admin.sock", "--metrics-listen", ""});
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("admin socket directory " + dir + " is writable by every user"), std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
  // In a sticky one, as /tmp (entries stay their owners'), it serves the
  // socket to its owner and group only.
  BrokerProcess b(next_port());
  ASSERT_TRUE(b.running());
  struct stat st {};
  ASSERT_EQ(::stat(b.admin_socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

INSTANTIATE_TEST_SUITE_P(Via, Ops, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
