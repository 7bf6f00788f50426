// SPDX-License-Identifier: Apache-2.0
// One segment file of a stream: records appended at its end, read by
// offset, cut back after a failed write or a torn tail, synced, removed
// whole when retention no longer needs any record in it. Named by the
// sequence of its first record (00000000000000000001.seg), so the files
// sort in stream order and a damaged first record still has its place.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "rdmabroker/common/fd.hpp"
#include "store/record.hpp"
#include "store/store_error.hpp"

namespace rdmabroker::daemon::store {

using StoreStatus = StoreResult<std::monostate>;

class Segment {
 public:
  /// Creates `dir`/<first_sequence>.seg, empty, and syncs `dir` so the
  /// file survives a crash once its records do.
  static StoreResult<Segment> create(const std::string& dir, std::uint64_t first_sequence);
  /// Opens the segment at `path` for reading and appending at its end.
  static StoreResult<Segment> open(const std::string& path, std::uint64_t first_sequence);
  /// The first sequence a segment file named `name` holds, or 0 if `name` is not a segment's.
  static std::uint64_t first_sequence_of(const std::string& name);

  std::uint64_t first_sequence() const { return first_sequence_; }
  std::uint64_t size() const { return size_; }  // written
  /// Where the next staged record goes.
  std::uint64_t end() const { return staged_ends_.empty() ? size_ : staged_ends_.back(); }
  const std::string& path() const { return path_; }

  /// Queues a record for the next flush(): `header` is copied, `rest` is
  /// not (its bytes must stay valid until then). Returns the offset the
  /// record will start at.
  std::uint64_t stage(const std::array<std::byte, kRecordHeaderBytes>& header, std::span<const iovec> rest);
  /// Writes what stage() queued, in as few calls as IOV_MAX allows (one
  /// system call for a batch of records, not one each); `records_written`:
  /// how many of them are in the file. On a failed or short write those
  /// written whole stay and the rest is cut back off.
  StoreStatus flush(std::size_t& records_written);
  /// Reads up to `into.size()` bytes at `offset` (fewer at the file's end); how many.
  StoreResult<std::size_t> read_some(std::uint64_t offset, std::span<std::byte> into) const;
  /// Reads `into.size()` bytes at `offset`.
  StoreStatus read(std::uint64_t offset, std::span<std::byte> into) const;
  /// Cuts the file to `size` bytes (a torn tail).
  StoreStatus truncate(std::uint64_t size);
  /// fdatasync: what was appended survives a crash.
  StoreStatus sync();
  /// Closes and unlinks the file.
  StoreStatus remove();

 private:
  Segment(UniqueFd fd, std::string path, std::uint64_t first_sequence, std::uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), first_sequence_(first_sequence), size_(size) {}

  UniqueFd fd_;
  std::string path_;
  std::uint64_t first_sequence_ = 0;
  std::uint64_t size_ = 0;  // written: staged records start here
  std::vector<iovec> staged_;
  std::vector<std::uint64_t> staged_ends_;                                // where each staged record ends
  std::deque<std::array<std::byte, kRecordHeaderBytes>> staged_headers_;  // a deque: iovecs point into it
};

/// An error for `what` on `path` from errno: kDiskFull for ENOSPC/EDQUOT, else kIo.
StoreError io_error(const char* what, const std::string& path, int err);
/// fsync of directory `dir` (a file created, renamed or removed in it).
StoreStatus sync_directory(const std::string& dir);
/// Replaces file `path` with `text` whole: written beside it, synced
/// (`sync`), renamed over it and, with `sync`, its directory synced. A crash
/// leaves the old file or the new one, never a part.
StoreStatus replace_file(const std::string& path, std::string_view text, bool sync = true);

}  // namespace rdmabroker::daemon::store
