// SPDX-License-Identifier: Apache-2.0
#include "reconnecting_consumer.hpp"

#include <algorithm>

namespace rdmabroker {

void SessionBoard::set(std::shared_ptr<Session> s) {
  {
    std::lock_guard lock(mu_);
    current_ = std::move(s);
  }
  cv_.notify_all();
}

void SessionBoard::end(const Error& why) {
  {
    std::lock_guard lock(mu_);
    if (!ended_) ended_ = why;
    current_.reset();
  }
  cv_.notify_all();
}

Result<std::shared_ptr<Session>> SessionBoard::next_after(const Session* gone, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  const bool come =
      cv_.wait_until(lock, deadline, [&] { return ended_ || (current_ && current_.get() != gone); });
  if (ended_) return *ended_;
  if (!come) return Error{ErrorKind::kTimeout, "reconnecting: no connection yet"};
  return current_;
}

namespace {

std::chrono::milliseconds left(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                  std::chrono::milliseconds{0});
}

class ReconnectingConsumer final : public Consumer {
 public:
  ReconnectingConsumer(std::shared_ptr<SessionBoard> board, std::string stream, ConsumerOptions options,
                       std::shared_ptr<Session> session, std::shared_ptr<Consumer> first)
      : board_(std::move(board)),
        stream_(std::move(stream)),
        options_(std::move(options)),
        pending_(first->pending_at_open()),
        now_{std::move(session), std::move(first)} {}
  ~ReconnectingConsumer() override { (void)close(); }

  std::uint32_t sid() const override { return current().consumer->sid(); }
  std::uint64_t pending_at_open() const override { return pending_; }

  Result<Message> next(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const Opened k = current();
      auto m = k.consumer->next(left(deadline));
      if (m) {
        handed_out(m->stream_sequence);
        return m;
      }
      if (auto st = reopen_if_cut(m.error(), k, deadline); !st) return st.error();
    }
  }

  Result<std::vector<Message>> fetch(std::size_t count, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const Opened k = current();
      auto got = k.consumer->fetch(count, left(deadline));
      if (got) {
        for (const Message& m : *got) handed_out(m.stream_sequence);
        return got;
      }
      if (auto st = reopen_if_cut(got.error(), k, deadline); !st) return st.error();
    }
  }

  // On the connection of now: after a reconnect a durable consumer takes the
  // acknowledgement of a message delivered before it (by sequence).
  Status ack(const Message& m) override { return current().consumer->ack(m); }
  Status nak(const Message& m) override { return current().consumer->nak(m); }

  Status close() override {
    Opened k;
    {
      std::lock_guard lock(mu_);
      if (std::exchange(closed_, true)) return {};
      k = now_;
    }
    return k.consumer->close();
  }

 private:
  struct Opened {
    std::shared_ptr<Session> session;
    std::shared_ptr<Consumer> consumer;
  };

  Opened current() const {
    std::lock_guard lock(mu_);
    return now_;
  }
  void handed_out(std::uint64_t sequence) {
    std::lock_guard lock(mu_);
    last_handed_out_ = std::max(last_handed_out_, sequence);
  }

  /// `why` is what `k`'s consumer answered. Only a consumer whose
  /// connection ended (not one the broker or the application ended) is
  /// opened again, on the next connection; ok: try again.
  Status reopen_if_cut(const Error& why, const Opened& k, Clock::time_point deadline) {
    if (why.kind != ErrorKind::kClosed) return why;
    {
      std::lock_guard lock(mu_);
      if (closed_) return why;
      if (now_.consumer != k.consumer) return {};  // another thread opened it again meanwhile
    }
    if (k.session->close_reason().message.empty()) return why;  // its connection is up
    std::shared_ptr<Session> gone = k.session;                  // held: its address is not reused meanwhile
    Result<std::shared_ptr<Consumer>> reopened = why;
    std::shared_ptr<Session> session;
    for (;;) {
      auto s = board_->next_after(gone.get(), deadline);
      if (!s) return s.error();
      session = s.value();
      reopened = session->consume(stream_, options_for_reopen(), left(deadline));
      if (reopened) break;
      // That connection failed too: wait for the one after it (not again on it).
      if (reopened.error().kind != ErrorKind::kClosed || session->close_reason().message.empty())
        return reopened.error();
      gone = session;
    }
    std::lock_guard lock(mu_);
    if (closed_) {
      (void)reopened.value()->close();
      return why;
    }
    now_ = {std::move(session), reopened.value()};
    return {};
  }

  ConsumerOptions options_for_reopen() const {
    ConsumerOptions o = options_;
    std::lock_guard lock(mu_);
    // A durable consumer resumes where the broker has it; an ephemeral one
    // ended with its connection, so it starts after what it handed out.
    if (o.durable.empty() && last_handed_out_ != 0) {
      o.start = ConsumerOptions::Start::kSequence;
      o.start_sequence = last_handed_out_ + 1;
    }
    return o;
  }

  const std::shared_ptr<SessionBoard> board_;
  const std::string stream_;
  const ConsumerOptions options_;
  const std::uint64_t pending_;
  mutable std::mutex mu_;
  Opened now_;  // guarded by mu_
  std::uint64_t last_handed_out_ = 0;
  bool closed_ = false;
};

}  // namespace

std::shared_ptr<Consumer> make_reconnecting_consumer(std::shared_ptr<SessionBoard> board, std::string stream,
                                                     ConsumerOptions options,
                                                     std::shared_ptr<Session> session,
                                                     std::shared_ptr<Consumer> first) {
  return std::make_shared<ReconnectingConsumer>(std::move(board), std::move(stream), std::move(options),
                                                std::move(session), std::move(first));
}

}  // namespace rdmabroker
