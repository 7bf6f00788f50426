// SPDX-License-Identifier: Apache-2.0
// The load generator behind `rdmabroker bench` and the NATS and Redis drivers
// of the benchmark suite (tests/bench/drivers/): N publishers and M
// subscribers (or queue-group members), each on its own connection, flat out
// or at a fixed rate. Every payload starts with a stamp (publisher, sequence,
// send time), so subscribers check loss and reordering per publisher and
// record latency in a histogram; at a fixed rate the send time is the
// *scheduled* time, which corrects for coordinated omission (a stalled
// publisher does not hide the delay it causes). Reports per client and in
// aggregate, as text or --json.
//
// The engine knows nothing about the system under test: each system supplies
// a BenchEndpoint (one connection) and the same measurement runs on all of
// them, so rdmabroker, NATS and Redis are driven identically.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace CLI {
class App;
}

namespace rdmabroker::bench {

struct BenchOptions {
  std::string url;
  /// Where the subscribers connect, in turn (subscriber i to i mod n): other
  /// brokers of a cluster than the publishers' (docs/cluster.md); empty: url.
  std::vector<std::string> sub_urls;
  std::string subject = "bench";
  std::string queue;  // subscribers join this queue group; empty: each gets everything
  std::uint32_t publishers = 1;
  std::uint32_t subscribers = 1;
  std::uint32_t size = 64;       // payload bytes, at least the 24-byte stamp
  std::uint64_t count = 100000;  // per publisher (when duration is 0)
  double duration_s = 0;         // per publisher, instead of count
  double rate = 0;               // messages/s per publisher; 0: flat out
  bool json = false;
  bool progress = true;
  /// The latency budget (--trace): each message's time split into stages
  /// (publish call, both hops, the broker, the library's hand-over), as a
  /// table of percentiles per stage. Needs a client that tells when it took a
  /// message and a broker that says its relay time (rdmabroker, protocol 5).
  bool trace = false;
  /// The broker's wake-ups so far (its workers' blocking waits that
  /// returned), when the system under test can tell; read before and after
  /// the measurement.
  std::function<std::optional<std::uint64_t>()> broker_wakeups;
};

/// One connection to the system under test. Errors are returned as text
/// (empty: success); the engine reports them per client.
/// A message as a subscriber's client handed it over.
struct Received {
  /// Implicit: a client that tells nothing more hands over its payload.
  Received(std::span<const std::byte> p) : payload(p) {}
  Received(std::span<const std::byte> p, std::int64_t received, std::int64_t relay)
      : payload(p), received_ns(received), relay_ns(relay) {}
  std::span<const std::byte> payload;
  std::int64_t received_ns = 0;  // steady clock: when the client took it from the transport; 0: unknown
  std::int64_t relay_ns = 0;     // how long it spent in the broker, as the broker says; 0: unknown
};

class BenchEndpoint {
 public:
  using OnPayload = std::function<void(const Received&)>;
  virtual ~BenchEndpoint() = default;
  /// Subscribes (in `queue` when not empty) and returns once the system has
  /// the subscription, so nothing published afterwards is missed.
  virtual std::string subscribe(const std::string& subject, const std::string& queue,
                                OnPayload on_payload) = 0;
  /// `more`: another publish follows at once (flat out); a client that
  /// buffers may wait for it before writing. False before an idle gap.
  virtual std::string publish(const std::string& subject, std::span<const std::byte> payload, bool more) = 0;
  /// Returns once everything published has reached the system.
  virtual std::string flush(std::chrono::milliseconds timeout) = 0;
  /// Closes; returns why the connection had failed, if it had.
  virtual std::string close() = 0;
  virtual std::string describe() const = 0;
  /// Wake-ups of this connection's client so far (its I/O thread and the
  /// application threads that slept in it), if the client counts them.
  virtual std::optional<std::uint64_t> wakeups() const { return std::nullopt; }
};

/// Opens one connection to the system under test at `url` (the publishers'
/// -s, or a subscriber's --sub-server).
using Connect = std::function<std::unique_ptr<BenchEndpoint>(std::string& error, const std::string& url)>;

/// Adds the shared options (everything but url/transport) to a command line.
void add_bench_options(CLI::App& app, BenchOptions& opt);

/// Runs the benchmark; prints the report on stdout. `system` names what is
/// measured in the report. Exit status: 0, or 1 when a connection failed or
/// messages were lost; 2 for bad options.
int run_bench(const BenchOptions& opt, const std::string& system, const Connect& connect);

/// main() of a driver for another system (tests/bench/drivers): the same
/// options as `rdmabroker bench` plus -s URL (default `default_url`).
int driver_main(int argc, char** argv, const std::string& system, const std::string& default_url,
                const std::function<Connect(const BenchOptions& opt)>& make_connect);

}  // namespace rdmabroker::bench
