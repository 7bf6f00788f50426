// SPDX-License-Identifier: Apache-2.0
// One worker's data path with no device and no thread, for the unit tests
// and the micro-benchmarks: the broker's core (pool, slots, admission, an
// anonymous auth table), one worker's context, send blocks, connections,
// router and frame handler, wired as Worker wires them. The caller gives
// each connection its link (a test's fake that decodes what is sent, a
// benchmark's that only completes it) and plays the port: it hands over
// receives and ends the loop turn.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "broker/core.hpp"
#include "broker/send_blocks.hpp"
#include "connection/connections.hpp"
#include "connection/worker_context.hpp"
#include "frames/frame_handler.hpp"
#include "router/router.hpp"

namespace rdmabroker::daemon {

struct DataPathShape {
  std::uint32_t buffer_size = 4096;
  std::uint32_t max_connections = 16;
  std::uint32_t pool_buffers = 256;
  std::uint32_t send_blocks = 64;
  std::uint32_t workers = 1;  // this one is worker 0; deliveries to the others are batched
};

class WorkerDataPath {
 public:
  explicit WorkerDataPath(const DataPathShape& shape = {}) {
    core.options.buffer_size = shape.buffer_size;
    core.options.max_connections = shape.max_connections;
    pool = std::move(BufferPool::create(shape.pool_buffers, shape.buffer_size).value());
    core.pool = pool.get();
    core.slots = std::make_unique<ConnectionSlots>(shape.max_connections);
    core.admission = std::make_unique<Admission>(*core.slots, shape.max_connections, shape.buffer_size);
    config::AuthSettings auth;
    auth.anonymous = true;
    core.auth = AuthTable::build(auth);
    ctx = std::make_unique<WorkerContext>(0, core);
    blocks = std::make_unique<SendBlocks>(shape.send_blocks);
    connections = std::make_unique<Connections>(*ctx, *blocks);
    router = std::make_unique<Router>(*ctx, *connections);
    router->set_worker_count(shape.workers);
    frames = std::make_unique<FrameHandler>(*ctx, *connections, *router);
  }
  ~WorkerDataPath() {
    // The reverse of the wiring: what holds references goes first.
    frames.reset();
    router.reset();
    connections.reset();
  }
  WorkerDataPath(const WorkerDataPath&) = delete;
  WorkerDataPath& operator=(const WorkerDataPath&) = delete;

  /// A connection on `link` that the port has just accepted, established
  /// (its CONNECT not yet received).
  Connection& accept(std::unique_ptr<Link> link, std::uint8_t version, std::uint32_t send_window) {
    const std::uint64_t id = next_id++;
    auto conn = std::make_unique<Connection>(id, *core.slots->acquire(), "peer:" + std::to_string(id),
                                             std::move(link), core.options.buffer_size, send_window,
                                             ConnState::kAccepting);
    conn->protocol_version = version;
    Connection& c = connections->add(std::move(conn));
    connections->establish(c);
    return c;
  }
  /// A pool buffer holding `bytes`, as a receive brings them.
  BufferRef receive_buffer(std::span<const std::byte> bytes) {
    std::uint32_t index = 0;
    if (pool->acquire(&index, 1) != 1) std::abort();  // the shape gives every test enough
    BufferRef buf(pool.get(), index);
    std::memcpy(buf.data(), bytes.data(), bytes.size());
    return buf;
  }
  /// Hands `bytes` (whole frames) to the frame handler as one receive, then
  /// ends the loop turn: batches posted, touched connections flushed.
  void receive(Connection& c, std::span<const std::byte> bytes) {
    const BufferRef buf = receive_buffer(bytes);
    frames->process(c, buf, 0, static_cast<std::uint32_t>(bytes.size()));
    end_turn();
  }
  void end_turn() { connections->flush_touched(); }

  BrokerCore core;
  std::unique_ptr<BufferPool> pool;
  std::unique_ptr<WorkerContext> ctx;
  std::unique_ptr<SendBlocks> blocks;
  std::unique_ptr<Connections> connections;
  std::unique_ptr<Router> router;
  std::unique_ptr<FrameHandler> frames;
  std::uint64_t next_id = 1;
};

}  // namespace rdmabroker::daemon
