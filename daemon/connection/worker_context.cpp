// SPDX-License-Identifier: Apache-2.0
#include "connection/worker_context.hpp"

#include <spdlog/spdlog.h>

namespace rdmabroker::daemon {

void WorkerContext::note_pool_starved(bool starved) {
  if (starved == pool_starved_) return;
  pool_starved_ = starved;
  if (starved) {
    // Receives are not reposted and credits not returned until buffers come
    // back: publishers slow down, nothing is lost. Once per shortage.
    stats.pool_exhausted.add();
    spdlog::warn(
        "worker {}: the buffer pool is empty ({} buffers, all in use): receives wait for buffers to come "
        "back (raise buffers.pool if this recurs)",
        index, core.pool->count());
  } else {
    spdlog::info("worker {}: buffers available again", index);
  }
}

}  // namespace rdmabroker::daemon
