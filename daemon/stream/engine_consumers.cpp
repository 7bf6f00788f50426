// SPDX-License-Identifier: Apache-2.0
// The stream engine's consumers (SPEC.md §3.11, docs/streams.md
// "Consumers"): CONSUME, ACK and FETCH as the workers passed them on, and
// each turn's deliveries. A message is read from the store straight into a
// buffer of the broker's registered pool, its 32-byte record header
// overwritten with a PUBLISH header (the record's subject, header block and
// payload are laid out as a PUBLISH frame's body), and sent from there like
// any delivery: an RDMA consumer gets it without another copy.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include "rdmabroker/proto/wire.hpp"
#include "stream/consumer_state.hpp"
#include "stream/engine.hpp"

namespace rdmabroker::daemon {
namespace {

using Kind = ConsumerCommand::Kind;

/// Messages one consumer is sent per engine turn: a replay of millions
/// shares the thread with the publishers' appends.
constexpr int kTurnShare = 2048;
constexpr std::int64_t kSaveEveryNs = 50'000'000;
constexpr std::int64_t kNoBufferRetryNs = 1'000'000;

std::int64_t steady_clock_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

std::int64_t wall_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

OutItem control_for(proto::FrameType type, std::uint32_t sid, std::uint64_t value) {
  OutItem item = make_control(type, sid);
  item.header.sequence = value;
  item.fixed_sequence = true;
  return item;
}

/// Who an owner (Identity::owner()) is, in a message: every anonymous client is one.
std::string owner_text(const std::string& owner) {
  return owner.empty() ? std::string("anonymous clients") : "user '" + owner + "'";
}

void due_at(std::int64_t& due, std::int64_t when) {
  if (when != 0 && (due == 0 || when < due)) due = when;
}

}  // namespace

StreamEngine::Stream* StreamEngine::stream_named(std::string_view name) {
  for (auto& [id, s] : streams_) {
    if (s.stats->name == name) return &s;
  }
  return nullptr;
}

void StreamEngine::to_client(std::uint32_t worker, std::uint64_t connection, std::uint32_t slot,
                             OutItem item) {
  ready_[worker].push_back({connection, slot, std::move(item)});
  acks_due_ = true;
}

void StreamEngine::on_command(ConsumerCommand& c) {
  if (c.kind == Kind::kOpen) return open_consumer(c);
  if (c.kind == Kind::kClose) return close_member(c.connection, c.sid);
  if (c.kind == Kind::kRenew) return renew_member(c);
  const auto m = members_.find({c.connection, c.sid});
  if (m == members_.end()) return;  // the consumer was refused, or its stream removed
  auto s = streams_.find(m->second.first);
  if (s == streams_.end()) return;
  auto k = s->second.consumers.find(m->second.second);
  if (k == s->second.consumers.end()) return;
  Consumer& consumer = *k->second;
  const auto i = consumer.find_member(c.connection, c.sid);
  if (!i) return;
  switch (c.kind) {
    case Kind::kAck:
      consumer.ack(*i, c.sequence);
      break;
    case Kind::kNak:
      consumer.nak(*i, c.sequence);
      break;
    case Kind::kFetch: {
      const ConsumerMember& mem = consumer.members()[*i];
      if (!consumer.config().pull) break;  // a push consumer takes what its window allows
      if (mem.fetch_open)
        to_client(c.worker, c.connection, c.slot,
                  control_for(proto::FrameType::kFetchDone, c.sid, mem.fetch_sent));
      consumer.fetch(*i, c.sequence, c.expires_ms, steady_clock_ns());
      break;
    }
    default:
      break;
  }
}

void StreamEngine::refuse(const ConsumerCommand& c, proto::ErrorCode code, std::string why) {
  to_client(c.worker, c.connection, c.slot,
            make_control(proto::FrameType::kError, static_cast<std::uint32_t>(code), std::move(why), c.sid));
}

std::optional<std::string> StreamEngine::over_limits(const Stream& s, bool durable,
                                                     const Identity& who) const {
  const BrokerOptions& o = core_.options;
  if (s.consumers.size() >= o.max_consumers_per_stream) {
    return "stream " + s.stats->name + " has " + std::to_string(s.consumers.size()) +
           " consumers (limits.max_consumers_per_stream)";
  }
  std::size_t total = 0, owned = 0;
  const std::string owner = who.owner();
  for (const auto& [id, other] : streams_) {
    total += other.consumers.size();
    if (!durable) continue;
    for (const auto& [name, k] : other.consumers) owned += k->durable() && k->owner() == owner ? 1 : 0;
  }
  if (total >= o.max_consumers_total) {
    return "the broker has " + std::to_string(total) + " consumers (limits.max_consumers_total)";
  }
  if (durable && owned >= o.max_durables_per_user) {
    return owner_text(owner) + (owner.empty() ? " own " : " owns ") + std::to_string(owned) +
           " durable consumers (limits.max_durables_per_user)";
  }
  return std::nullopt;
}

void StreamEngine::expire_inactive(std::int64_t now) {
  const std::uint32_t threshold_s = core_.options.consumer_inactive_threshold_s;
  if (threshold_s == 0) return;
  const std::int64_t threshold = std::int64_t{threshold_s} * 1'000'000'000;
  for (auto& [id, s] : streams_) {
    const std::size_t before = s.consumers.size();
    for (auto it = s.consumers.begin(); it != s.consumers.end();) {
      const Consumer& k = *it->second;
      if (!k.durable() || k.idle_since() == 0 || now - k.idle_since() < threshold) {
        ++it;
        continue;
      }
      spdlog::info(
          "stream {}: durable consumer {} removed: no member for {} s (limits.consumer_inactive_threshold_s)",
          s.stats->name, k.name(), threshold_s);
      remove_consumer_file(s.dir, k.name());
      s.stats->consumers_expired.add();
      it = s.consumers.erase(it);
    }
    if (s.consumers.size() != before) refresh_consumers(s);
  }
}

std::optional<std::string> StreamEngine::refusal(const Stream& s, const Consumer& k,
                                                 const Identity& who) const {
  const std::string& stream = s.stats->name;
  if (std::none_of(s.subjects.begin(), s.subjects.end(),
                   [&](const std::string& p) { return who.may_receive_some(p); })) {
    return "user '" + who.name + "' may receive no subject of stream " + stream + " (" +
           fmt::format("{}", fmt::join(s.subjects, ", ")) + ")";
  }
  if (k.durable() && k.owner() && *k.owner() != who.owner() && !who.may_join(stream, k.name())) {
    return "durable consumer " + k.name() + " of stream " + stream + " belongs to " + owner_text(*k.owner()) +
           " (streams.join grants others)";
  }
  return std::nullopt;
}

void StreamEngine::open_consumer(const ConsumerCommand& c) {
  Stream* s = stream_named(c.stream);
  if (s == nullptr) return refuse(c, proto::ErrorCode::kNoStream, "no stream named " + c.stream);
  const bool durable = !c.durable.empty();
  const std::string name =
      durable ? c.durable : "_" + std::to_string(c.connection) + "_" + std::to_string(c.sid);
  const Identity& who = *c.identity;
  auto it = s->consumers.find(name);
  if (it != s->consumers.end()) {
    const auto& had = it->second->config();
    if (had.ack != c.config.ack || had.pull != c.config.pull) {
      return refuse(c, proto::ErrorCode::kConsumerInvalid,
                    "durable consumer " + name + " of stream " + c.stream +
                        " exists with another ack policy or mode (it keeps its settings)");
    }
    if (auto why = refusal(*s, *it->second, who)) return refuse(c, proto::ErrorCode::kPermissionDenied, *why);
    if (!it->second->owner()) {
      it->second->adopt(who.owner());
      spdlog::warn("stream {}: durable consumer {}, saved without an owner, now belongs to {}", c.stream,
                   name, owner_text(who.owner()));
    }
  } else {
    if (auto why = over_limits(*s, durable, who)) {
      log_throttled(refusal_log_, spdlog::level::warn, "stream {}: consumer {} refused: {}", c.stream, name,
                    *why);
      return refuse(c, proto::ErrorCode::kTooManySubscriptions, *why);
    }
    auto k = std::make_unique<Consumer>(name, durable, c.config, *s->store,
                                        durable ? std::optional<std::string>(who.owner()) : std::nullopt);
    if (auto why = refusal(*s, *k, who)) return refuse(c, proto::ErrorCode::kPermissionDenied, *why);
    it = s->consumers.emplace(name, std::move(k)).first;
    spdlog::info("stream {}: consumer {} created ({}, {})", c.stream, name, durable ? "durable" : "ephemeral",
                 owner_text(who.owner()));
  }
  ConsumerMember m;
  m.connection = c.connection;
  m.slot = c.slot;
  m.worker = c.worker;
  m.sid = c.sid;
  m.max_frame = c.max_frame;
  m.reader = c.identity;
  it->second->add_member(m);
  members_[{c.connection, c.sid}] = {s->id, name};
  to_client(c.worker, c.connection, c.slot,
            control_for(proto::FrameType::kConsumerReady, c.sid, it->second->unprocessed(*s->store)));
  if (durable) save_consumers(*s, true);
  refresh_consumers(*s);
}

void StreamEngine::renew_member(const ConsumerCommand& c) {
  const auto m = members_.find({c.connection, c.sid});
  if (m == members_.end()) return;
  auto s = streams_.find(m->second.first);
  if (s == streams_.end()) return;
  auto k = s->second.consumers.find(m->second.second);
  if (k == s->second.consumers.end()) return;
  ConsumerMember* member = k->second->member_at(c.connection, c.sid);
  if (member == nullptr) return;
  if (auto why = refusal(s->second, *k->second, *c.identity)) {
    spdlog::warn("stream {}: consumer {}: a member of connection {} leaves it after a reload: {}",
                 s->second.stats->name, k->second->name(), c.connection, *why);
    close_member(c.connection, c.sid);
    return refuse(c, proto::ErrorCode::kPermissionDenied,
                  "consumer revoked by a configuration reload: " + *why);
  }
  member->renew(c.identity);
}

void StreamEngine::load_durables(Stream& stream, const std::string& name) {
  std::vector<std::string> problems;
  const auto held = stream.store->stats();
  for (auto& [durable, state] : load_consumers(stream.dir, problems)) {
    if (state.next > held.last_sequence + 1) {
      // A position the stream never reached: its files were lost or
      // replaced. Skipping to it would hide every message until then, so the
      // consumer starts again from the first message the stream holds
      // (at least once) and says so.
      spdlog::error(
          "stream {}: durable consumer {} stood at sequence {}, beyond the stream's last ({}): the "
          "stream's files were lost or replaced; it starts again from the first message, {}",
          name, durable, state.next, held.last_sequence, held.first_sequence);
      stream.stats->consumer_resets.add();
      state.next = held.first_sequence;
      state.pending.clear();
      state.initial.clear();
    }
    auto k = std::make_unique<Consumer>(durable, std::move(state));
    k->mark_idle(steady_clock_ns());  // unused since the start, as far as this run knows
    stream.consumers.emplace(durable, std::move(k));
  }
  for (const auto& line : problems) spdlog::warn("stream {}: {}", name, line);
}

void StreamEngine::close_member(std::uint64_t connection, std::uint32_t sid) {
  const auto m = members_.find({connection, sid});
  if (m == members_.end()) return;
  const auto [stream, name] = m->second;
  members_.erase(m);
  auto s = streams_.find(stream);
  if (s == streams_.end()) return;
  auto k = s->second.consumers.find(name);
  if (k == s->second.consumers.end()) return;
  k->second->remove_member(connection, sid);
  if (k->second->members().empty()) k->second->mark_idle(steady_clock_ns());
  // An ephemeral consumer ends with its last member.
  if (!k->second->durable() && k->second->members().empty()) s->second.consumers.erase(k);
  refresh_consumers(s->second);
}

void StreamEngine::serve_consumers(std::int64_t now) {
  // Every turn: a message stored, an ACK or a deadline may each let one deliver.
  consumers_due_ns_ = 0;
  const std::int64_t wall = wall_ns();
  for (auto& [id, s] : streams_) {
    if (s.consumers.empty()) continue;
    bool served = false;
    for (auto& [name, k] : s.consumers) {
      if (k->members().empty()) continue;
      served = true;
      if (!serve(s, *k, now, wall)) due_at(consumers_due_ns_, now);
    }
    if (served) refresh_consumers(s);
    save_consumers(s, false);
  }
}

bool StreamEngine::serve(Stream& s, Consumer& k, std::int64_t now, std::int64_t wall) {
  std::int64_t next_deadline = 0;
  for (const auto& g : k.expire(now, &next_deadline)) advise(s, k, g);
  due_at(consumers_due_ns_, next_deadline);
  const std::uint64_t byte_limit = member_byte_limit();
  std::vector<Batch> batches(k.members().size());
  bool finished = true;
  int share = kTurnShare;
  std::int64_t pace_wait = 0;
  while (true) {
    if (share-- == 0) {
      finished = false;
      break;
    }
    auto p = k.pick(*s.store, wall, byte_limit, &pace_wait);
    if (!p) break;
    if (!deliver(s, k, *p, batches[p->member], now)) {
      due_at(consumers_due_ns_, now + kNoBufferRetryNs);
      break;
    }
  }
  if (pace_wait != 0) due_at(consumers_due_ns_, now + pace_wait);
  for (std::size_t i = 0; i < batches.size(); ++i) flush(k.members()[i], batches[i]);
  // Pull: a FETCH ends when it has its messages or its time is up.
  for (std::size_t i = 0; i < k.members().size(); ++i) {
    ConsumerMember& m = k.member(i);
    if (!m.fetch_open) continue;
    if (m.fetch_sent >= m.fetch_wanted || now >= m.fetch_deadline_ns) {
      m.fetch_open = false;
      to_client(m.worker, m.connection, m.slot,
                control_for(proto::FrameType::kFetchDone, m.sid, m.fetch_sent));
    } else {
      due_at(consumers_due_ns_, m.fetch_deadline_ns);
    }
  }
  return finished;
}

bool StreamEngine::deliver(Stream& s, Consumer& k, const Consumer::Pick& p, Batch& b, std::int64_t now) {
  const ConsumerMember& m = k.members()[p.member];
  const std::size_t length = s.store->length_of(p.sequence).value_or(0);
  const std::uint32_t buffer_size = core_.pool->buffer_size();
  const std::size_t frame_len = proto::align_up(length);
  if (length == 0 || frame_len > buffer_size) {
    k.skipped(p);  // gone meanwhile; or stored under a larger buffer_size than this start's
    return true;
  }
  if (!b.buf || b.used + frame_len > buffer_size) {
    flush(m, b);
    std::uint32_t index = 0;
    if (core_.pool->acquire(&index, 1, core_.pool_shares.reserve()) == 0) return false;
    b.buf = BufferRef(core_.pool, index);
    b.used = 0;
  }
  std::byte* at = b.buf.data() + b.used;
  auto r = s.store->read(p.sequence, std::span<std::byte>(at, buffer_size - b.used));
  if (!r) {
    // Damaged (counted by the store, logged here) or gone: as if acknowledged.
    log_throttled(refusal_log_, spdlog::level::warn, "stream {}: consumer {}: {}", s.stats->name, k.name(),
                  r.error().message);
    k.skipped(p);
    return true;
  }
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.flags = proto::kFlagStream;
  h.subject_len = static_cast<std::uint16_t>(r->subject.size());
  h.header_len = static_cast<std::uint16_t>(r->headers.size());
  h.payload_len = static_cast<std::uint32_t>(r->headers.size() + r->payload.size());
  h.offset = p.deliveries;
  h.sequence = p.sequence;
  proto::encode_header(at, h);  // over the record's header: the body is already in place
  std::memset(at + length, 0, frame_len - length);
  RoutedFrame f;
  f.offset = b.used;
  f.len = static_cast<std::uint32_t>(frame_len);
  f.payload_len = h.payload_len;
  f.header_len = h.header_len;
  if (!b.item.body || !extend_delivery(b.item, b.buf, m.sid, f, m.max_frame)) {
    flush(m, b);
    b.item = make_delivery(b.buf.clone(), m.sid, f, now);
  }
  b.used += static_cast<std::uint32_t>(frame_len);
  k.delivered(p, static_cast<std::uint32_t>(length), now);
  return true;
}

std::uint64_t StreamEngine::member_byte_limit() const {
  // A member's outstanding records sit in pool buffers packed one after the
  // other, a buffer per buffers.size bytes, while its connection's queue
  // holds them: half of what the connection may hold of the pool (past its
  // share it is cut as a slow consumer), and half its queue bound, so the
  // consumer is slowed for its own backlog, never cut for it (SPEC.md §3.11).
  const BrokerOptions& o = core_.options;
  const std::uint64_t share =
      static_cast<std::uint64_t>(core_.pool_shares.share(o.pool_share_percent)) / 2 * o.buffer_size;
  return std::max<std::uint64_t>(o.buffer_size, std::min<std::uint64_t>(o.max_pending_bytes / 2, share));
}

void StreamEngine::flush(const ConsumerMember& m, Batch& b) {
  if (b.item.body) to_client(m.worker, m.connection, m.slot, std::exchange(b.item, OutItem{}));
}

void StreamEngine::advise(const Stream& s, const Consumer& k, const Consumer::GivenUp& g) {
  spdlog::warn("stream {}: consumer {} gave up message {} after {} deliveries (max_deliver)", s.stats->name,
               k.name(), g.sequence, g.deliveries);
  const std::string subject = "$RB.ADVISORY.MAX_DELIVERIES." + s.stats->name + "." + k.name();
  const std::string payload = R"({"stream":")" + s.stats->name + R"(","consumer":")" + k.name() +
                              R"(","sequence":)" + std::to_string(g.sequence) + R"(,"deliveries":)" +
                              std::to_string(g.deliveries) + "}";
  std::vector<Subscriber> to;
  core_.index.match(subject, to);
  // Clients' and routes' subscriptions: not a stream's or a multicast channel's entries.
  std::erase_if(to, [this](const Subscriber& x) { return x.worker >= ready_.size(); });
  if (to.empty()) return;
  std::uint32_t index = 0;
  if (core_.pool->acquire(&index, 1, core_.pool_shares.reserve()) == 0) return;  // counted below as none sent
  BufferRef buf(core_.pool, index);
  proto::FrameHeader h;
  h.type = proto::FrameType::kPublish;
  h.subject_len = static_cast<std::uint16_t>(subject.size());
  h.payload_len = static_cast<std::uint32_t>(payload.size());
  const std::size_t len = proto::align_up(proto::kHeaderSize + subject.size() + payload.size());
  std::memset(buf.data(), 0, len);
  proto::encode_header(buf.data(), h);
  std::memcpy(buf.data() + proto::kHeaderSize, subject.data(), subject.size());
  std::memcpy(buf.data() + proto::kHeaderSize + subject.size(), payload.data(), payload.size());
  RoutedFrame f;
  f.len = static_cast<std::uint32_t>(len);
  f.payload_len = h.payload_len;
  for (const Subscriber& x : to)
    to_client(x.worker, x.connection, x.slot, make_delivery(buf.clone(), x.sid, f));
}

void StreamEngine::save_consumers(Stream& s, bool all) {
  const std::int64_t now = steady_clock_ns();
  if (!all && now - consumers_saved_ns_ < kSaveEveryNs) {
    // Not yet: a turn when it is time, so that a changed position is not left unsaved.
    for (const auto& [name, k] : s.consumers) {
      if (k->durable() && k->dirty()) due_at(consumers_due_ns_, consumers_saved_ns_ + kSaveEveryNs);
    }
    return;
  }
  consumers_saved_ns_ = now;
  for (auto& [name, k] : s.consumers) {
    if (!k->durable() || !k->take_dirty()) continue;
    if (auto st = save_consumer(s.dir, name, k->state(), storage_.sync == config::StreamSync::kAlways); !st) {
      s.stats->consumer_save_errors.add();
      log_throttled(refusal_log_, spdlog::level::err, "stream {}: consumer {} not saved: {}", s.stats->name,
                    name, st.error().message);
      // Tried again at the next save (a full disk may have room by then),
      // whether or not the consumer changes meanwhile.
      k->mark_dirty();
      due_at(consumers_due_ns_, now + kSaveEveryNs);
    }
  }
}

void StreamEngine::refresh_consumers(Stream& s) {
  StreamStats& m = *s.stats;
  std::uint64_t pending = 0;
  for (const auto& [name, k] : s.consumers) {
    const ConsumerCounts c = k->take_counts();
    m.delivered.add(c.delivered);
    m.redelivered.add(c.redelivered);
    m.consumer_acks.add(c.acked);
    m.max_deliveries.add(c.max_deliveries);
    m.consumer_denied.add(c.denied);
    pending += k->outstanding();
  }
  m.consumers.set(static_cast<std::int64_t>(s.consumers.size()));
  m.consumer_pending.set(static_cast<std::int64_t>(pending));
}

}  // namespace rdmabroker::daemon
