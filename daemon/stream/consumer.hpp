// SPDX-License-Identifier: Apache-2.0
// One consumer of a stream (docs/streams.md, "Consumers"; SPEC.md §3.11):
// where it stands in the stream, what it delivered and waits to hear about,
// and which of its members (a client's subscription id on a connection)
// takes the next message. Pure bookkeeping: the engine reads the messages
// and sends them; this decides which and to whom.
//
// Positions. Everything below `next_` was delivered once (or skipped by the
// start policy); `pending_` holds what was delivered and is not acknowledged
// yet (ack explicit or cumulative), with its delivery count and its
// deadline; `redeliver_` what is due again (a deadline passed, a NAK, a
// member gone). A durable consumer's state is those three (consumer_state.cpp).
//
// Thread: the stream engine's.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "broker/auth.hpp"
#include "rdmabroker/proto/consumer.hpp"
#include "store/message_store.hpp"

namespace rdmabroker::daemon {

/// A client's subscription that receives a consumer's messages.
struct ConsumerMember {
  std::uint64_t connection = 0;
  std::uint32_t slot = 0;
  std::uint32_t worker = 0;
  std::uint32_t sid = 0;
  std::uint32_t max_frame = 0;          // the client's receive buffer size
  std::uint32_t outstanding = 0;        // delivered to it, not acknowledged (ack none: not reported)
  std::uint64_t outstanding_bytes = 0;  // their records' bytes
  std::deque<std::pair<std::uint64_t, std::uint32_t>> unreported;  // ack none: sequence, bytes
  // Pull: the open FETCH (SPEC.md §3.11).
  bool fetch_open = false;
  std::uint64_t fetch_wanted = 0;
  std::uint64_t fetch_sent = 0;
  std::int64_t fetch_deadline_ns = 0;  // steady
  /// Whose subscribe permissions every message delivered to it passes, as a
  /// live delivery would (null: anyone's; the unit tests').
  std::shared_ptr<const Identity> reader;
  /// May a message on `subject` go to it? Remembered per subject (bounded).
  bool may_read(std::string_view subject);
  /// New permissions (a reload): what was remembered is forgotten.
  void renew(std::shared_ptr<const Identity> identity);
  SubjectVerdicts verdicts;  // may_read()'s
};

/// What a consumer counts (the engine sums them per stream for /metrics).
struct ConsumerCounts {
  std::uint64_t delivered = 0;
  std::uint64_t redelivered = 0;
  std::uint64_t acked = 0;
  std::uint64_t max_deliveries = 0;  // messages given up after max_deliver deliveries
  std::uint64_t denied = 0;          // passed over: no member's user may read their subject
};

class Consumer {
 public:
  /// A message to deliver now, and to whom.
  struct Pick {
    std::uint64_t sequence = 0;
    std::uint32_t deliveries = 0;  // this one included
    std::size_t member = 0;        // index into members()
    enum class Source : std::uint8_t { kStream, kInitial, kRedelivery } source = Source::kStream;
  };
  /// A message that reached max_deliver without an acknowledgement.
  struct GivenUp {
    std::uint64_t sequence = 0;
    std::uint32_t deliveries = 0;
  };
  /// What a durable consumer keeps across restarts.
  struct State {
    /// Who owns a durable consumer (Identity::owner(): a user's name, ""
    /// for anonymous clients); none in a state an older broker saved.
    std::optional<std::string> owner;
    proto::ConsumerConfig config;
    std::uint64_t next = 1;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> pending;  // sequence, deliveries
    std::vector<std::uint64_t> initial;  // last / last per subject, not delivered yet
  };

  /// A new consumer at the start its config names, in `store` as it is now.
  Consumer(std::string name, bool durable, const proto::ConsumerConfig& config,
           const store::MessageStore& store, std::optional<std::string> owner = std::nullopt);
  /// A durable consumer as it was saved: what was pending is due again.
  Consumer(std::string name, State state);

  const std::string& name() const { return name_; }
  bool durable() const { return durable_; }
  const proto::ConsumerConfig& config() const { return config_; }
  const std::optional<std::string>& owner() const { return owner_; }
  /// Since when (steady ns) it has had no member; 0 while it has one.
  std::int64_t idle_since() const { return members_.empty() ? idle_since_ns_ : 0; }
  void mark_idle(std::int64_t now_ns) { idle_since_ns_ = now_ns; }
  /// A consumer saved without an owner takes its first member's user.
  void adopt(std::string owner) {
    owner_ = std::move(owner);
    dirty_ = true;
  }
  const std::vector<ConsumerMember>& members() const { return members_; }
  ConsumerMember& member(std::size_t i) { return members_[i]; }
  /// What it counted since the last call.
  ConsumerCounts take_counts() { return std::exchange(counts_, ConsumerCounts{}); }
  /// Messages delivered and not acknowledged (ack none: not reported as taken).
  std::uint64_t outstanding() const;
  /// Messages of `store` it has yet to deliver (redeliveries included).
  std::uint64_t unprocessed(const store::MessageStore& store) const;
  /// Changed since the last take_dirty() (a durable one's state to save).
  bool take_dirty() { return std::exchange(dirty_, false); }
  /// Its state could not be saved: to be saved again.
  void mark_dirty() { dirty_ = true; }
  bool dirty() const { return dirty_; }
  State state() const;

  void add_member(const ConsumerMember& m);
  /// Finds the member; null if it is none.
  ConsumerMember* member_at(std::uint64_t connection, std::uint32_t sid) {
    const auto i = find_member(connection, sid);
    return i ? &members_[*i] : nullptr;
  }
  /// Removes the member; what it had not acknowledged is due again at once.
  /// False if it was not a member.
  bool remove_member(std::uint64_t connection, std::uint32_t sid);
  std::optional<std::size_t> find_member(std::uint64_t connection, std::uint32_t sid) const;

  /// The next message to deliver, if a member may take one and read its
  /// subject (round robin among those): a redelivery first, then the next
  /// in the stream; `byte_limit` bounds a member's outstanding bytes. Skips
  /// what `store` no longer holds, and passes over (counted as `denied`)
  /// what no member's user may read. With original pace, `pace_wait_ns`
  /// says how long until the next one is due.
  std::optional<Pick> pick(const store::MessageStore& store, std::int64_t wall_ns, std::uint64_t byte_limit,
                           std::int64_t* pace_wait_ns);
  /// `p` was sent (`bytes` its record's length) at `now_ns` (steady).
  void delivered(const Pick& p, std::uint32_t bytes, std::int64_t now_ns);
  /// `p` could not be read (gone, or corrupt): as if acknowledged.
  void skipped(const Pick& p);

  /// ACK of `sequence` from a member: explicit acknowledges it, cumulative
  /// it and every earlier one, none reports it and those before it taken.
  void ack(std::size_t member, std::uint64_t sequence);
  /// NAK: deliver `sequence` again now.
  void nak(std::size_t member, std::uint64_t sequence);
  /// Deliveries whose deadline passed are due again, or given up (returned)
  /// after max_deliver; the earliest deadline still ahead, or 0.
  std::vector<GivenUp> expire(std::int64_t now_ns, std::int64_t* next_deadline_ns);
  /// Pull: FETCH of `count` messages open for `expires_ms` (ends the open one).
  void fetch(std::size_t member, std::uint64_t count, std::uint32_t expires_ms, std::int64_t now_ns);

 private:
  struct Pending {
    std::uint32_t deliveries = 0;
    std::uint32_t bytes = 0;
    std::int64_t deadline_ns = 0;  // steady; 0: due again (in redeliver_) or never sent since loading
    std::uint64_t connection = 0;  // the member it went to
    std::uint32_t sid = 0;
  };
  void release(std::uint64_t connection, std::uint32_t sid, std::uint32_t bytes);
  /// Room for another message (and, pull, an open FETCH that wants one).
  bool may_take(const ConsumerMember& m, std::uint64_t byte_limit) const;
  /// The next member in turn that may take a message on `subject`.
  std::optional<std::size_t> member_for(std::string_view subject, std::uint64_t byte_limit);
  /// The message due next (member not chosen), without moving past it.
  std::optional<Pick> candidate(const store::MessageStore& store, std::int64_t wall_ns,
                                std::int64_t* pace_wait_ns);
  void erase_pending(std::map<std::uint64_t, Pending>::iterator it);
  /// Moves the source `p` came from past it (delivered or skipped alike).
  void advance_past(const Pick& p);

  const std::string name_;
  const bool durable_;
  const proto::ConsumerConfig config_;
  std::optional<std::string> owner_;
  std::uint64_t next_ = 1;
  std::deque<std::uint64_t> initial_;
  std::map<std::uint64_t, Pending> pending_;
  std::deque<std::uint64_t> redeliver_;
  std::deque<std::pair<std::int64_t, std::uint64_t>> deadlines_;  // deadline, sequence: in order
  std::vector<ConsumerMember> members_;
  std::size_t next_member_ = 0;
  std::int64_t pace_origin_ns_ = 0;   // original pace: the wall time of the first message sent,
  std::int64_t pace_started_ns_ = 0;  // and the wall time it was sent
  ConsumerCounts counts_;
  bool dirty_ = true;
  std::int64_t idle_since_ns_ = 0;
};

}  // namespace rdmabroker::daemon
