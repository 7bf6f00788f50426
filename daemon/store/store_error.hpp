// SPDX-License-Identifier: Apache-2.0
// What the message store reports when it cannot do what it was asked: a
// code the layer above turns into its typed refusal (a full stream and a
// full disk are different answers to a durable publisher), and a message
// for the operator's log.
#pragma once

#include <cstdint>
#include <string>

#include "rdmabroker/result.hpp"

namespace rdmabroker::daemon::store {

enum class StoreErrc {
  kIo,        // a read, write, sync or file operation failed (errno in the message)
  kDiskFull,  // ENOSPC or EDQUOT: nothing was kept, the store takes messages again when space returns
  kFull,      // the stream's limits refuse new messages (discard: new)
  kTooLarge,  // the message is larger than the stream's max_msg_size
  kNotFound,  // no live message has that sequence (never stored, removed by a limit or a purge)
  kCorrupt,   // the record's CRC does not match: it is skipped from then on and counted
  kTooSmall,  // the caller's buffer cannot hold the record (needed size in `needed`)
};

struct StoreError {
  StoreErrc code;
  std::string message;
  std::size_t needed = 0;       // kTooSmall: the record's size
  std::uint64_t lost_from = 0;  // flush(): the first staged sequence not stored (all after it too)
};

template <typename T>
using StoreResult = Result<T, StoreError>;

/// "the disk is full", "the stream is full", ...: the code's name in words.
const char* to_string(StoreErrc code);

}  // namespace rdmabroker::daemon::store
