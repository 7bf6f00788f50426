// SPDX-License-Identifier: Apache-2.0
#include "stream/consumer.hpp"

#include <algorithm>
#include <utility>

namespace rdmabroker::daemon {

using proto::ConsumerAck;
using proto::ConsumerStart;

Consumer::Consumer(std::string name, bool durable, const proto::ConsumerConfig& config,
                   const store::MessageStore& store, std::optional<std::string> owner)
    : name_(std::move(name)), durable_(durable), config_(config), owner_(std::move(owner)) {
  const store::StoreStats st = store.stats();
  const std::uint64_t after_last = st.last_sequence + 1;
  switch (config.start) {
    case ConsumerStart::kAll:
      next_ = 1;
      break;
    case ConsumerStart::kNew:
      next_ = after_last;
      break;
    case ConsumerStart::kLast:
      next_ = st.messages != 0 ? st.last_sequence : after_last;
      break;
    case ConsumerStart::kLastPerSubject: {
      const auto last = store.last_per_subject();
      initial_.assign(last.begin(), last.end());
      next_ = after_last;
      break;
    }
    case ConsumerStart::kSequence:
      next_ = config.start_at;
      break;
    case ConsumerStart::kTime:
      next_ = store.first_at_time(static_cast<std::int64_t>(config.start_at)).value_or(after_last);
      break;
  }
}

Consumer::Consumer(std::string name, State state)
    : name_(std::move(name)),
      durable_(true),
      config_(state.config),
      owner_(std::move(state.owner)),
      next_(state.next) {
  initial_.assign(state.initial.begin(), state.initial.end());
  // What was delivered before the restart and not acknowledged is due again.
  for (const auto& [sequence, deliveries] : state.pending) {
    pending_[sequence] = Pending{deliveries, 0, 0, 0, 0};
    redeliver_.push_back(sequence);
  }
}

std::uint64_t Consumer::outstanding() const {
  if (config_.ack != ConsumerAck::kNone) return pending_.size();
  std::uint64_t n = 0;
  for (const auto& m : members_) n += m.outstanding;
  return n;
}

std::uint64_t Consumer::unprocessed(const store::MessageStore& store) const {
  return store.live_from(next_) + initial_.size() + redeliver_.size();
}

Consumer::State Consumer::state() const {
  State s{owner_, config_, next_, {}, {initial_.begin(), initial_.end()}};
  s.pending.reserve(pending_.size());
  for (const auto& [sequence, p] : pending_) s.pending.emplace_back(sequence, p.deliveries);
  return s;
}

void Consumer::add_member(const ConsumerMember& m) { members_.push_back(m); }

std::optional<std::size_t> Consumer::find_member(std::uint64_t connection, std::uint32_t sid) const {
  for (std::size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].connection == connection && members_[i].sid == sid) return i;
  }
  return std::nullopt;
}

bool Consumer::remove_member(std::uint64_t connection, std::uint32_t sid) {
  const auto i = find_member(connection, sid);
  if (!i) return false;
  for (auto& [sequence, p] : pending_) {
    if (p.deadline_ns != 0 && p.connection == connection && p.sid == sid) {
      p.deadline_ns = 0;  // its deadline entry is stale now
      redeliver_.push_back(sequence);
    }
  }
  std::sort(redeliver_.begin(), redeliver_.end());
  members_.erase(members_.begin() + static_cast<std::ptrdiff_t>(*i));
  if (next_member_ >= members_.size()) next_member_ = 0;
  dirty_ = true;
  return true;
}

bool ConsumerMember::may_read(std::string_view subject) {
  if (!reader || reader->subscribe_unrestricted) return true;
  return verdicts.get(subject, [&](std::string_view s) { return reader->may_subscribe(s); });
}

void ConsumerMember::renew(std::shared_ptr<const Identity> identity) {
  reader = std::move(identity);
  verdicts.clear();
}

bool Consumer::may_take(const ConsumerMember& m, std::uint64_t byte_limit) const {
  return m.outstanding_bytes < byte_limit &&
         (!config_.pull || (m.fetch_open && m.fetch_sent < m.fetch_wanted));
}

std::optional<std::size_t> Consumer::member_for(std::string_view subject, std::uint64_t byte_limit) {
  for (std::size_t tries = 0; tries < members_.size(); ++tries) {
    const std::size_t i = (next_member_ + tries) % members_.size();
    if (may_take(members_[i], byte_limit) && members_[i].may_read(subject)) {
      next_member_ = i + 1;
      return i;
    }
  }
  return std::nullopt;
}

std::optional<Consumer::Pick> Consumer::candidate(const store::MessageStore& store, std::int64_t wall_ns,
                                                  std::int64_t* pace_wait_ns) {
  while (!redeliver_.empty()) {
    const std::uint64_t sequence = redeliver_.front();
    auto it = pending_.find(sequence);
    if (it == pending_.end() || it->second.deadline_ns != 0) {
      redeliver_.pop_front();  // acknowledged meanwhile, or already sent again
      continue;
    }
    if (!store.length_of(sequence)) {
      pending_.erase(it);  // removed by the stream's limits: nothing left to deliver
      redeliver_.pop_front();
      continue;
    }
    return Pick{sequence, it->second.deliveries + 1, 0, Pick::Source::kRedelivery};
  }
  // Flow control: no new message while max_ack_pending are outstanding.
  if (outstanding() >= config_.max_ack_pending) return std::nullopt;
  while (!initial_.empty()) {
    if (store.length_of(initial_.front())) return Pick{initial_.front(), 1, 0, Pick::Source::kInitial};
    initial_.pop_front();
  }
  const auto sequence = store.next_live(next_);
  if (!sequence) return std::nullopt;
  if (config_.original_pace) {
    const std::int64_t t = store.time_of(*sequence).value_or(0);
    if (pace_started_ns_ == 0) {
      pace_origin_ns_ = t;
      pace_started_ns_ = wall_ns;
    }
    const std::int64_t due = pace_started_ns_ + (t - pace_origin_ns_);
    if (wall_ns < due) {
      *pace_wait_ns = due - wall_ns;
      return std::nullopt;
    }
  }
  return Pick{*sequence, 1, 0, Pick::Source::kStream};
}

std::optional<Consumer::Pick> Consumer::pick(const store::MessageStore& store, std::int64_t wall_ns,
                                             std::uint64_t byte_limit, std::int64_t* pace_wait_ns) {
  if (std::none_of(members_.begin(), members_.end(),
                   [&](const ConsumerMember& m) { return may_take(m, byte_limit); }))
    return std::nullopt;
  while (auto p = candidate(store, wall_ns, pace_wait_ns)) {
    const std::string_view subject = store.subject_of(p->sequence).value_or(std::string_view{});
    if (auto m = member_for(subject, byte_limit)) {
      p->member = *m;
      return p;
    }
    // A member that may read it has no room yet: it waits for that one.
    if (std::any_of(members_.begin(), members_.end(), [&](ConsumerMember& m) { return m.may_read(subject); }))
      return std::nullopt;
    // No member's user may read its subject: as outside the consumer's view
    // (docs/security.md, "Streams"), passed over for good and counted.
    ++counts_.denied;
    skipped(*p);
  }
  return std::nullopt;
}

void Consumer::delivered(const Pick& p, std::uint32_t bytes, std::int64_t now_ns) {
  ConsumerMember& m = members_[p.member];
  ++counts_.delivered;
  if (p.deliveries > 1) ++counts_.redelivered;
  if (config_.pull) ++m.fetch_sent;
  ++m.outstanding;
  m.outstanding_bytes += bytes;
  advance_past(p);
  if (config_.ack == ConsumerAck::kNone) {
    m.unreported.emplace_back(p.sequence, bytes);
  } else {
    const std::int64_t deadline = now_ns + std::int64_t{config_.ack_wait_ms} * 1'000'000;
    pending_[p.sequence] = Pending{p.deliveries, bytes, deadline, m.connection, m.sid};
    deadlines_.emplace_back(deadline, p.sequence);
  }
  dirty_ = true;
}

void Consumer::skipped(const Pick& p) {
  if (p.source == Pick::Source::kRedelivery) pending_.erase(p.sequence);
  advance_past(p);
  dirty_ = true;
}

void Consumer::advance_past(const Pick& p) {
  switch (p.source) {
    case Pick::Source::kRedelivery:
      redeliver_.pop_front();
      break;
    case Pick::Source::kInitial:
      initial_.pop_front();
      break;
    case Pick::Source::kStream:
      next_ = p.sequence + 1;
      break;
  }
}

void Consumer::release(std::uint64_t connection, std::uint32_t sid, std::uint32_t bytes) {
  for (auto& m : members_) {
    if (m.connection == connection && m.sid == sid) {
      if (m.outstanding > 0) --m.outstanding;
      m.outstanding_bytes -= std::min<std::uint64_t>(m.outstanding_bytes, bytes);
      return;
    }
  }
}

void Consumer::erase_pending(std::map<std::uint64_t, Pending>::iterator it) {
  if (it->second.deadline_ns != 0) release(it->second.connection, it->second.sid, it->second.bytes);
  pending_.erase(it);
  ++counts_.acked;
}

void Consumer::ack(std::size_t member, std::uint64_t sequence) {
  switch (config_.ack) {
    case ConsumerAck::kNone: {
      // A report of what the application took: room for more (flow control).
      ConsumerMember& m = members_[member];
      while (!m.unreported.empty() && m.unreported.front().first <= sequence) {
        release(m.connection, m.sid, m.unreported.front().second);
        m.unreported.pop_front();
      }
      return;
    }
    case ConsumerAck::kExplicit:
      if (auto it = pending_.find(sequence); it != pending_.end()) erase_pending(it);
      break;
    case ConsumerAck::kCumulative:
      while (!pending_.empty() && pending_.begin()->first <= sequence) erase_pending(pending_.begin());
      break;
  }
  dirty_ = true;
}

void Consumer::nak(std::size_t member, std::uint64_t sequence) {
  (void)member;
  auto it = pending_.find(sequence);
  if (it == pending_.end() || it->second.deadline_ns == 0) return;
  release(it->second.connection, it->second.sid, it->second.bytes);
  it->second.deadline_ns = 0;
  redeliver_.push_front(sequence);
}

std::vector<Consumer::GivenUp> Consumer::expire(std::int64_t now_ns, std::int64_t* next_deadline_ns) {
  std::vector<GivenUp> given_up;
  while (!deadlines_.empty() && deadlines_.front().first <= now_ns) {
    const auto [deadline, sequence] = deadlines_.front();
    deadlines_.pop_front();
    auto it = pending_.find(sequence);
    if (it == pending_.end() || it->second.deadline_ns != deadline) continue;  // acknowledged, or sent again
    Pending& p = it->second;
    release(p.connection, p.sid, p.bytes);
    if (config_.max_deliver != 0 && p.deliveries >= config_.max_deliver) {
      given_up.push_back({sequence, p.deliveries});
      ++counts_.max_deliveries;
      pending_.erase(it);
      dirty_ = true;
      continue;
    }
    p.deadline_ns = 0;
    redeliver_.push_back(sequence);
  }
  *next_deadline_ns = deadlines_.empty() ? 0 : deadlines_.front().first;
  return given_up;
}

void Consumer::fetch(std::size_t member, std::uint64_t count, std::uint32_t expires_ms, std::int64_t now_ns) {
  ConsumerMember& m = members_[member];
  m.fetch_open = true;
  m.fetch_wanted = count;
  m.fetch_sent = 0;
  m.fetch_deadline_ns = now_ns + std::int64_t{expires_ms} * 1'000'000;
}

}  // namespace rdmabroker::daemon
