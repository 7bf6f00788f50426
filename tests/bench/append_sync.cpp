// SPDX-License-Identifier: Apache-2.0
// append_sync: how a stream's store should append and sync (docs/streams.md,
// "Storage"): COUNT records of SIZE bytes appended to a file in groups of
// GROUP (one group commit each), three ways:
//   write     one pwrite per record, then fdatasync;
//   writev    one pwritev for the group's records, then fdatasync: what
//             FileStore does (it stages a batch and flushes it);
//   io_uring  the group's writes and a linked IORING_FSYNC_DATASYNC in one
//             submission (Debian's liburing), waited for together.
// Prints records/s and the p50/p99 of a group's commit (µs), one JSON line
// per way. tests/bench/append-sync.sh runs it on this host's disk.
#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double records_per_s = 0, p50_us = 0, p99_us = 0;
};

Result summarize(std::vector<double> us, std::size_t records, Clock::time_point t0) {
  std::sort(us.begin(), us.end());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return {static_cast<double>(records) / secs, us[us.size() / 2],
          us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

Result with_write(int fd, std::size_t size, std::size_t count, std::size_t group) {
  const std::string record(size, 'r');
  std::vector<double> us;
  off_t at = 0;
  const auto t0 = Clock::now();
  for (std::size_t done = 0; done < count; done += group) {
    const auto g0 = Clock::now();
    for (std::size_t i = 0; i < group; ++i, at += static_cast<off_t>(size)) {
      if (::pwrite(fd, record.data(), size, at) != static_cast<ssize_t>(size)) std::abort();
    }
    if (::fdatasync(fd) != 0) std::abort();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - g0).count());
  }
  return summarize(us, count, t0);
}

Result with_writev(int fd, std::size_t size, std::size_t count, std::size_t group) {
  const std::string record(size, 'r');
  const std::vector<iovec> parts(group, iovec{const_cast<char*>(record.data()), size});
  std::vector<double> us;
  off_t at = 0;
  const auto t0 = Clock::now();
  for (std::size_t done = 0; done < count; done += group) {
    const auto g0 = Clock::now();
    const auto bytes = static_cast<ssize_t>(size * group);
    if (::pwritev(fd, parts.data(), static_cast<int>(group), at) != bytes) std::abort();
    at += bytes;
    if (::fdatasync(fd) != 0) std::abort();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - g0).count());
  }
  return summarize(us, count, t0);
}

Result with_uring(int fd, std::size_t size, std::size_t count, std::size_t group) {
  io_uring ring;
  if (io_uring_queue_init(static_cast<unsigned>(group + 1), &ring, 0) != 0) std::abort();
  const std::string record(size, 'r');
  std::vector<double> us;
  off_t at = 0;
  const auto t0 = Clock::now();
  for (std::size_t done = 0; done < count; done += group) {
    const auto g0 = Clock::now();
    for (std::size_t i = 0; i < group; ++i, at += static_cast<off_t>(size)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_write(sqe, fd, record.data(), static_cast<unsigned>(size), static_cast<__u64>(at));
      io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);  // the sync runs after every write of the group
    }
    io_uring_prep_fsync(io_uring_get_sqe(&ring), fd, IORING_FSYNC_DATASYNC);
    if (io_uring_submit_and_wait(&ring, static_cast<unsigned>(group + 1)) < 0) std::abort();
    for (std::size_t i = 0; i <= group; ++i) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring, &cqe) != 0 || cqe->res < 0) std::abort();
      io_uring_cqe_seen(&ring, cqe);
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - g0).count());
  }
  io_uring_queue_exit(&ring);
  return summarize(us, count, t0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: append_sync DIR SIZE COUNT GROUP\n");
    return 64;
  }
  const std::string dir = argv[1];
  const std::size_t size = std::strtoul(argv[2], nullptr, 10), count = std::strtoul(argv[3], nullptr, 10),
                    group = std::strtoul(argv[4], nullptr, 10);
  for (const char* way : {"write", "writev", "io_uring", "write", "writev", "io_uring"}) {
    const std::string path = dir + "/append-sync-" + way;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 1;
    const std::string w = way;
    const Result r = w == "write"    ? with_write(fd, size, count, group)
                     : w == "writev" ? with_writev(fd, size, count, group)
                                     : with_uring(fd, size, count, group);
    ::close(fd);
    ::unlink(path.c_str());
    std::printf(
        "{\"way\":\"%s\",\"size\":%zu,\"group\":%zu,\"records_per_s\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f}"
        "\n",
        way, size, group, r.records_per_s, r.p50_us, r.p99_us);
  }
  return 0;
}
