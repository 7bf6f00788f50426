// SPDX-License-Identifier: Apache-2.0
// redis_bench: `rdmabroker bench`'s measurement against redis-server's
// pub/sub, through hiredis (Debian's libhiredis-dev). Same stamp, histogram
// and report as `rdmabroker bench`; only the connection differs.
//
// A publisher pipelines PUBLISH commands the way a Redis user who cares about
// throughput would: flat out they are written in batches (up to 64 KiB) and
// the integer replies are read back a window at a time; at a fixed rate each
// command is written at once. A subscriber is a connection in SUBSCRIBE mode
// read by its own thread. Redis pub/sub has no queue groups (-q is refused).
#include <hiredis/hiredis.h>
#include <sys/socket.h>

#include <string>
#include <thread>

#include "bench.hpp"

namespace {

using rdmabroker::bench::BenchEndpoint;

constexpr std::size_t kWriteBatchBytes = 64 * 1024;
constexpr std::size_t kReplyWindow = 1024;  // PUBLISH replies left unread at most

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

class RedisEndpoint final : public BenchEndpoint {
 public:
  static std::unique_ptr<BenchEndpoint> connect(const std::string& host, int port, std::string& error) {
    redisContext* ctx = redisConnect(host.c_str(), port);
    if (ctx == nullptr || ctx->err != 0) {
      error = ctx != nullptr ? ctx->errstr : "cannot allocate a redis context";
      if (ctx != nullptr) redisFree(ctx);
      return nullptr;
    }
    return std::unique_ptr<BenchEndpoint>(new RedisEndpoint(ctx, host + ":" + std::to_string(port)));
  }
  ~RedisEndpoint() override { close(); }

  std::string subscribe(const std::string& subject, const std::string& queue, OnPayload on_payload) override {
    if (!queue.empty()) return "Redis pub/sub has no queue groups";
    // The reply to SUBSCRIBE is the server's confirmation: from here on the
    // subscription is active.
    ReplyPtr r(static_cast<redisReply*>(redisCommand(ctx_, "SUBSCRIBE %b", subject.data(), subject.size())));
    if (!r) return ctx_->errstr;
    if (r->type != REDIS_REPLY_ARRAY) return "unexpected reply to SUBSCRIBE";
    reader_ = std::thread([this, f = std::move(on_payload)] {
      for (;;) {
        void* raw = nullptr;
        if (redisGetReply(ctx_, &raw) != REDIS_OK) {
          if (!closing_) read_error_ = ctx_->errstr;
          return;
        }
        ReplyPtr m(static_cast<redisReply*>(raw));
        if (m->type == REDIS_REPLY_ARRAY && m->elements == 3 &&
            std::string_view(m->element[0]->str) == "message") {
          f(std::span(reinterpret_cast<const std::byte*>(m->element[2]->str), m->element[2]->len));
        }
      }
    });
    return {};
  }
  std::string publish(const std::string& subject, std::span<const std::byte> payload, bool more) override {
    if (redisAppendCommand(ctx_, "PUBLISH %b %b", subject.data(), subject.size(), payload.data(),
                           payload.size()) != REDIS_OK) {
      return ctx_->errstr;
    }
    ++unanswered_;
    if (!more || sdslen(ctx_->obuf) >= kWriteBatchBytes) {
      if (auto e = write_out(); !e.empty()) return e;
    }
    return unanswered_ >= kReplyWindow ? read_replies() : std::string();
  }
  std::string flush(std::chrono::milliseconds) override {
    if (auto e = write_out(); !e.empty()) return e;
    return read_replies();
  }
  std::string close() override {
    if (ctx_ == nullptr) return {};
    if (reader_.joinable()) {
      closing_ = true;
      ::shutdown(ctx_->fd, SHUT_RDWR);  // ends the reader's blocking read
      reader_.join();
    }
    redisFree(ctx_);
    ctx_ = nullptr;
    return read_error_;
  }
  std::string describe() const override { return "redis " + where_; }

 private:
  RedisEndpoint(redisContext* ctx, std::string where) : ctx_(ctx), where_(std::move(where)) {}

  std::string write_out() {
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(ctx_, &done) != REDIS_OK) return ctx_->errstr;
    }
    return {};
  }
  std::string read_replies() {
    for (; unanswered_ > 0; --unanswered_) {
      void* raw = nullptr;
      if (redisGetReply(ctx_, &raw) != REDIS_OK) return ctx_->errstr;
      ReplyPtr r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) return r->str;
    }
    return {};
  }

  redisContext* ctx_;
  std::string where_;
  std::size_t unanswered_ = 0;
  std::thread reader_;
  std::atomic<bool> closing_{false};
  std::string read_error_;
};

}  // namespace

int main(int argc, char** argv) {
  return rdmabroker::bench::driver_main(
      argc, argv, "redis", "redis://127.0.0.1:6379", [](const rdmabroker::bench::BenchOptions& opt) {
        // redis://host[:port]
        std::string rest = opt.url.starts_with("redis://") ? opt.url.substr(8) : opt.url;
        int port = 6379;
        if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
          port = std::stoi(rest.substr(colon + 1));
          rest.resize(colon);
        }
        // One server: --sub-server is not for Redis (its subscribers use -s).
        return [host = rest, port](std::string& error, const std::string&) {
          return RedisEndpoint::connect(host, port, error);
        };
      });
}
