// `rdmabroker bench`: N publishers and M subscribers (or queue-group members)
// on their own connections, flat out or at a fixed rate, over rdma:// or
// tcp://. Every payload carries (publisher, sequence, send time), so
// subscribers check loss and reordering per publisher and measure latency;
// at a fixed rate the send time is the *scheduled* time, which corrects for
// coordinated omission (a stalled publisher does not hide the delay it
// causes). Reports per client and in aggregate, as text or --json.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "rdmabroker/client.hpp"

namespace rdmabroker::cli {

struct BenchOptions {
  std::string url;
  std::string bind;
  std::string subject = "bench";
  std::string queue;              // subscribers join this queue group; empty: each gets everything
  std::uint32_t publishers = 1;
  std::uint32_t subscribers = 1;
  std::uint32_t size = 64;        // payload bytes, at least the 24-byte stamp
  std::uint64_t count = 100000;   // per publisher (when duration is 0)
  double duration_s = 0;          // per publisher, instead of count
  double rate = 0;                // messages/s per publisher; 0: flat out
  bool json = false;
  bool progress = true;
};

/// Runs the benchmark; prints the report on stdout. Exit status: 0, or 1 when
/// a connection failed or messages were lost.
int run_bench(const BenchOptions& opt);

}  // namespace rdmabroker::cli
