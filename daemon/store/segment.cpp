// SPDX-License-Identifier: Apache-2.0
#include "store/segment.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace rdmabroker::daemon::store {
namespace {

constexpr std::size_t kNameDigits = 20;
constexpr const char* kSuffix = ".seg";

}  // namespace

const char* to_string(StoreErrc code) {
  switch (code) {
    case StoreErrc::kIo:
      return "an I/O error";
    case StoreErrc::kDiskFull:
      return "the disk is full";
    case StoreErrc::kFull:
      return "the stream is full";
    case StoreErrc::kTooLarge:
      return "the message is larger than the stream takes";
    case StoreErrc::kNotFound:
      return "no such message";
    case StoreErrc::kCorrupt:
      return "the stored message is damaged";
    case StoreErrc::kTooSmall:
      return "the buffer is too small for the message";
  }
  return "?";
}

StoreError io_error(const char* what, const std::string& path, int err) {
  const bool full = err == ENOSPC || err == EDQUOT;
  return {full ? StoreErrc::kDiskFull : StoreErrc::kIo,
          std::string(what) + " " + path + ": " + std::strerror(err)};
}

StoreStatus sync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) return io_error("syncing directory", dir, errno);
  return std::monostate{};
}

StoreStatus replace_file(const std::string& path, std::string_view text, bool sync) {
  const std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640));
    if (!fd) return io_error("writing", tmp, errno);
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        (sync && ::fdatasync(fd.get()) != 0)) {
      return io_error("writing", tmp, errno);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return io_error("renaming", tmp, errno);
  if (!sync) return std::monostate{};
  const auto slash = path.rfind('/');
  return sync_directory(slash == std::string::npos ? std::string(".") : path.substr(0, slash));
}

std::uint64_t Segment::first_sequence_of(const std::string& name) {
  if (name.size() != kNameDigits + std::strlen(kSuffix) || !name.ends_with(kSuffix)) return 0;
  std::uint64_t seq = 0;
  for (std::size_t i = 0; i < kNameDigits; ++i) {
    const char c = name[i];
    if (c < '0' || c > '9') return 0;
    seq = seq * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return seq;
}

StoreResult<Segment> Segment::create(const std::string& dir, std::uint64_t first_sequence) {
  char name[kNameDigits + 8];
  std::snprintf(name, sizeof name, "%020llu%s", static_cast<unsigned long long>(first_sequence), kSuffix);
  std::string path = dir + "/" + name;
  // O_EXCL: a file of that name is a segment this store did not account for.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640));
  if (!fd) return io_error("creating segment", path, errno);
  if (auto s = sync_directory(dir); !s) return s.error();
  return Segment(std::move(fd), std::move(path), first_sequence, 0);
}

StoreResult<Segment> Segment::open(const std::string& path, std::uint64_t first_sequence) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return io_error("opening segment", path, errno);
  return Segment(std::move(fd), path, first_sequence, static_cast<std::uint64_t>(st.st_size));
}

std::uint64_t Segment::stage(const std::array<std::byte, kRecordHeaderBytes>& header,
                             std::span<const iovec> rest) {
  const std::uint64_t at = end();
  auto& copy = staged_headers_.emplace_back(header);
  staged_.push_back({copy.data(), copy.size()});
  std::uint64_t ends = at + copy.size();
  for (const iovec& v : rest) {
    if (v.iov_len == 0) continue;
    staged_.push_back(v);
    ends += v.iov_len;
  }
  staged_ends_.push_back(ends);
  return at;
}

StoreStatus Segment::flush(std::size_t& records_written) {
  const std::uint64_t at = size_;
  int err = 0;
  std::uint64_t written = 0;
  for (std::size_t i = 0; i < staged_.size() && err == 0;) {
    const std::size_t n = std::min<std::size_t>(staged_.size() - i, IOV_MAX);
    const auto first = staged_.begin() + static_cast<std::ptrdiff_t>(i);
    const std::size_t want = std::accumulate(first, first + static_cast<std::ptrdiff_t>(n), std::size_t{0},
                                             [](std::size_t t, const iovec& v) { return t + v.iov_len; });
    const ssize_t w =
        ::pwritev(fd_.get(), staged_.data() + i, static_cast<int>(n), static_cast<off_t>(at + written));
    if (w < 0 && errno == EINTR) continue;
    if (w > 0) written += static_cast<std::uint64_t>(w);
    if (w != static_cast<ssize_t>(want)) err = w < 0 ? errno : ENOSPC;  // short: the disk filled meanwhile
    i += n;
  }
  // The records wholly written stay; a record cut short is cut back off, so
  // the next one starts where the last whole record ended.
  const auto whole = std::upper_bound(staged_ends_.begin(), staged_ends_.end(), at + written);
  records_written = static_cast<std::size_t>(whole - staged_ends_.begin());
  const std::uint64_t end = records_written == 0 ? at : staged_ends_[records_written - 1];
  staged_.clear();
  staged_ends_.clear();
  staged_headers_.clear();
  if (err == 0) {
    size_ = end;
    return std::monostate{};
  }
  if (::ftruncate(fd_.get(), static_cast<off_t>(end)) != 0) {
    records_written = 0;
    size_ = at;
    return io_error("cutting back a failed write to", path_, errno);
  }
  size_ = end;
  return io_error("writing to", path_, err);
}

StoreResult<std::size_t> Segment::read_some(std::uint64_t offset, std::span<std::byte> into) const {
  for (;;) {
    const ssize_t n = ::pread(fd_.get(), into.data(), into.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return io_error("reading", path_, errno);
  }
}

StoreStatus Segment::read(std::uint64_t offset, std::span<std::byte> into) const {
  std::size_t done = 0;
  while (done < into.size()) {
    const ssize_t n =
        ::pread(fd_.get(), into.data() + done, into.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("reading", path_, errno);
    if (n == 0)
      return StoreError{StoreErrc::kCorrupt, "reading " + path_ + ": the file ends inside a record"};
    done += static_cast<std::size_t>(n);
  }
  return std::monostate{};
}

StoreStatus Segment::truncate(std::uint64_t size) {
  if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) return io_error("truncating", path_, errno);
  size_ = size;
  return std::monostate{};
}

StoreStatus Segment::sync() {
  if (::fdatasync(fd_.get()) != 0) return io_error("syncing", path_, errno);
  return std::monostate{};
}

StoreStatus Segment::remove() {
  fd_.reset();
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return io_error("removing", path_, errno);
  return std::monostate{};
}

}  // namespace rdmabroker::daemon::store
