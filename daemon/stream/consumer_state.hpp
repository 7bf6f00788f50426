// SPDX-License-Identifier: Apache-2.0
// A durable consumer's state on disk (docs/streams.md, "Consumers"): one
// JSON file per consumer in its stream's directory, consumers/NAME.json,
// replaced whole (written beside it, then renamed over it) so that a crash
// leaves the old state or the new one, never half of either. What it holds
// is where the consumer stands: losing the last write to a crash only
// delivers again what was acknowledged just before (at least once).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "rdmabroker/result.hpp"
#include "stream/consumer.hpp"

namespace rdmabroker::daemon {

/// Writes `state` as `stream_dir`/consumers/`name`.json; `sync`: fdatasync
/// it before the rename (storage.sync: always).
Status save_consumer(const std::string& stream_dir, const std::string& name, const Consumer::State& state,
                     bool sync);
/// Removes a durable consumer's file (it was deleted).
void remove_consumer_file(const std::string& stream_dir, const std::string& name);
/// Every durable consumer saved under `stream_dir`; `problems` gets a line
/// for each file that could not be read (left out, not removed).
std::vector<std::pair<std::string, Consumer::State>> load_consumers(const std::string& stream_dir,
                                                                    std::vector<std::string>& problems);

}  // namespace rdmabroker::daemon
