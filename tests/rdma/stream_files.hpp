// SPDX-License-Identifier: Apache-2.0
// What the stream tests share: a broker with streams under a directory of
// the test's own (StreamTest), and what a stream's directory holds, read
// with the broker's own store (daemon/store/FileStore) once the broker has
// stopped: how they check what was stored, byte for byte.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "store/file_store.hpp"

namespace rdmabroker::test {

struct StoredMessage {
  std::string subject;
  std::string headers;  // the header block as stored
  std::string payload;
};

/// Every live message of the store in `directory`, in sequence order.
inline std::vector<StoredMessage> read_stream(const std::string& directory) {
  auto s = daemon::store::FileStore::open({directory, std::uint64_t{64} << 20, {}}, 0);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  std::vector<StoredMessage> out;
  if (!s.ok()) return out;
  std::vector<std::byte> buf(1 << 16);
  for (auto seq = s.value()->next_live(1); seq; seq = s.value()->next_live(*seq + 1)) {
    auto r = s.value()->read(*seq, buf);
    EXPECT_TRUE(r.ok()) << "message " << *seq << ": " << (r.ok() ? "" : r.error().message);
    if (!r.ok()) continue;
    const auto text = [](std::span<const std::byte> b) {
      return std::string(reinterpret_cast<const char*>(b.data()), b.size());
    };
    out.push_back({std::string(r->subject), text(r->headers), text(r->payload)});
  }
  return out;
}

/// A PUBLISH of `payload` (one byte by default) on `subject` with `flags`
/// and `sequence`: a frame to break a stream rule with, or to send many of
/// in one SEND.
inline std::vector<std::byte> publish_frame(std::string_view subject, std::uint16_t flags,
                                            std::uint64_t sequence, std::string_view payload = "x") {
  std::vector<std::byte> out(proto::align_up(proto::kHeaderSize + subject.size() + payload.size()));
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.flags = flags;
  h.payload_len = static_cast<std::uint32_t>(payload.size());
  h.sequence = sequence;
  proto::encode_frame(out, h, subject, "", std::as_bytes(std::span(payload.data(), payload.size())));
  return out;
}

/// A broken rule: sent alone on a connection of `version`, the bytes get an
/// ERROR of `code` whose text has `text`, then the connection's end.
struct BrokenRule {
  const char* what;
  std::uint8_t version;
  std::vector<std::byte> bytes;
  proto::ErrorCode code;
  const char* text;
};
inline void expect_each_closes_its_sender(const BrokerProcess& broker, Via via,
                                          const std::vector<BrokenRule>& rules) {
  for (const auto& r : rules) {
    SCOPED_TRACE(r.what);
    auto w = raw_wire(broker, via, true, proto::ConnectRequest{16384, 16, 0, r.version});
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->send(r.bytes));
    auto [code, text] = expect_error_then_close(*w, std::chrono::seconds(10));
    EXPECT_EQ(code, r.code) << text;
    EXPECT_NE(text.find(r.text), std::string::npos) << text;
  }
}

/// A broker (started by start()) whose streams live in a directory of this
/// test's, removed with it; over RDMA (in the guest) or TCP.
class StreamTest : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
    std::filesystem::create_directories(data_);
  }
  void TearDown() override {
    broker_.reset();
    ::unlink(config_.c_str());
    if (mounted_) ::umount2(data_.c_str(), MNT_DETACH);
    std::filesystem::remove_all(data_);
  }
  /// (Re)starts the broker with `streams` (the YAML list) under `storage`
  /// (more storage: settings, indented as its fields) and `other` (more
  /// top-level settings).
  void start(const std::string& streams, const std::string& storage = "", const std::string& other = "") {
    write_config(streams, storage, other);
    broker_.reset();
    broker_ = std::make_unique<BrokerProcess>(port_, std::vector<std::string>{"--config", config_});
    ASSERT_TRUE(broker_->running());
  }
  void write_config(const std::string& streams, const std::string& storage = "",
                    const std::string& other = "") {
    write_file(config_, other + "storage:\n  directory: " + data_ + "\n" + storage + "streams:\n" + streams);
  }

  /// A tmpfs of `size` ("512k") at data_, in a mount namespace of this test
  /// process's own that the broker it starts inherits: a disk that fills for
  /// real. Root only (CI and the guest): check geteuid() and skip first.
  void mount_small_disk(const char* size) {
    ASSERT_EQ(::unshare(CLONE_NEWNS), 0) << std::strerror(errno);
    ASSERT_EQ(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0) << std::strerror(errno);
    ASSERT_EQ(::mount("tmpfs", data_.c_str(), "tmpfs", 0, (std::string("size=") + size).c_str()), 0)
        << std::strerror(errno);
    mounted_ = true;
  }

  /// Fills the disk mount_small_disk() made with files of a page each
  /// (`fill-N` in data_) until a write fails; returns their paths, so that
  /// removing some makes that much room again.
  std::vector<std::string> fill_small_disk() {
    std::vector<std::string> pages;
    const std::string page(4096, 'f');
    for (int i = 0; i < 1000; ++i) {
      const std::string path = data_ + "/fill-" + std::to_string(i);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
      if (fd < 0) break;
      const bool whole = ::write(fd, page.data(), page.size()) == static_cast<ssize_t>(page.size());
      ::close(fd);
      if (!whole) {
        std::filesystem::remove(path);
        return pages;
      }
      pages.push_back(path);
    }
    ADD_FAILURE() << "the small disk never filled";
    return pages;
  }

  const std::string config_ = "/tmp/rdmabroker-streams-" + std::to_string(getpid()) + ".yaml";
  const std::string data_ = "/tmp/rdmabroker-streams-" + std::to_string(getpid()) + ".d";
  const std::uint16_t port_ = next_port();
  bool mounted_ = false;  // data_ is a file system the test mounted
  std::unique_ptr<BrokerProcess> broker_;
};

}  // namespace rdmabroker::test
