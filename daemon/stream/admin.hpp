// SPDX-License-Identifier: Apache-2.0
// Streams managed at run time (docs/streams.md, "Managing streams"): the
// admin socket's `stream ls|info|add|purge|rm` commands, and the stream.json
// that keeps a stream `stream add` made across restarts.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rdmabroker/config/settings.hpp"

namespace rdmabroker::daemon {

class StreamEngine;

/// The JSON reply to the admin command `stream <args>` (null engine: none).
std::string stream_admin(StreamEngine* engine, std::string_view args);

/// A stream `stream add` made: kept as <directory>/<name>/stream.json.
void remember_runtime(const std::string& directory, const config::StreamSettings& s);
void forget_runtime(const std::string& directory, const std::string& name);
/// The settings in <directory>/<name>/stream.json, if it holds a valid one (else `why`).
std::optional<config::StreamSettings> runtime_settings(const std::string& directory, const std::string& name,
                                                       std::string& why);
/// Deletes a removed stream's directory with everything in it.
void delete_stream_files(const std::string& dir);

}  // namespace rdmabroker::daemon
