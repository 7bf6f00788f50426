// SPDX-License-Identifier: Apache-2.0
#include "stream/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "fault/fault.hpp"
#include "rdmabroker/proto/wire.hpp"
#include "store/file_store.hpp"
#include "stream/admin.hpp"
#include "stream/consumer_state.hpp"
#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker::daemon {
namespace {

using std::chrono::steady_clock;

std::int64_t steady_ns() { return steady_clock::now().time_since_epoch().count(); }
std::int64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

store::StoreLimits limits_of(const config::StreamSettings& s) {
  store::StoreLimits l;
  l.max_msgs = s.max_msgs;
  l.max_bytes = s.max_bytes;
  l.max_age_ns = static_cast<std::int64_t>(s.max_age_s) * 1'000'000'000;
  l.max_msgs_per_subject = s.max_msgs_per_subject;
  l.max_msg_size = s.max_msg_size;
  l.discard = s.discard == config::StreamDiscard::kNew ? store::Discard::kNew : store::Discard::kOld;
  return l;
}

constexpr std::int64_t kExpireEveryNs = 1'000'000'000;
constexpr std::int64_t kNsPerSecond = 1'000'000'000;

proto::ErrorCode code_of(store::StoreErrc e) {
  switch (e) {
    case store::StoreErrc::kFull:
      return proto::ErrorCode::kStreamFull;
    case store::StoreErrc::kDiskFull:
      return proto::ErrorCode::kDiskFull;
    case store::StoreErrc::kTooLarge:
      return proto::ErrorCode::kPayloadTooLarge;
    default:
      return proto::ErrorCode::kInternalError;
  }
}

}  // namespace

Result<std::unique_ptr<StreamEngine>> StreamEngine::create(
    BrokerCore& core, const config::StorageSettings& storage,
    const std::vector<config::StreamSettings>& streams) {
  std::unique_ptr<StreamEngine> e(new StreamEngine(core, storage));
  for (const auto& s : streams) {
    const std::uint32_t id = e->next_id_++;
    auto stream = e->open(s, id);
    if (!stream) return stream.error();
    e->streams_.emplace(id, std::move(stream.value()));
    e->register_stream(s, id);
  }
  e->open_runtime_streams();
  return e;
}

StreamEngine::~StreamEngine() { stop(); }

Result<StreamEngine::Stream> StreamEngine::open(const config::StreamSettings& s, std::uint32_t id) {
  store::RecoveryReport report;
  const std::string dir = directory_ + "/" + s.name;
  store::FileStoreOptions options{dir, std::uint64_t{64} << 20, limits_of(s), {}};
  if constexpr (fault::kEnabled) {
    options.fail_sync = [this] { return fault::Shared::take(core_.faults.sync_fails); };
  }
  auto st = store::FileStore::open(options, realtime_ns(), &report);
  if (!st) {
    return Error{ErrorKind::kResource, "stream " + s.name + ": " + st.error().message};
  }
  for (const auto& line : report.problems) spdlog::warn("stream {}: {}", s.name, line);
  // Called on the engine thread (the store's owner from here on).
  st.value()->on_drop([this, id] {
    if (auto it = streams_.find(id); it != streams_.end()) save_duplicates(it->second);
  });
  Stream stream{
      id,
      std::move(st.value()),
      std::make_shared<StreamStats>(s.name),
      DuplicateWindow(static_cast<std::int64_t>(s.duplicate_window_s) * kNsPerSecond, s.duplicate_ids_max),
      false,
      {}};
  stream.dir = dir;
  restore_duplicates(stream);
  stream.subjects = s.subjects;
  load_durables(stream, s.name);
  const auto info = stream.store->stats();
  spdlog::info("stream {}: {} in {}, subjects {}: {} messages, sequences {}..{}, {} durable consumers",
               s.name, report.segments == 0 ? "new" : "opened", dir, fmt::join(s.subjects, ", "),
               info.messages, info.first_sequence, info.last_sequence, stream.consumers.size());
  refresh(stream);
  std::lock_guard lock(stats_mu_);
  stats_[s.name] = stream.stats;
  return stream;
}

void StreamEngine::register_stream(const config::StreamSettings& s, std::uint32_t id) {
  Registered r{id, s, {}};
  for (const auto& pattern : s.subjects) {
    Subscriber entry{kStreamWorker, id, 0, core_.stream_slot, 0};
    // In a cluster the stream is interest like a client's subscription: the
    // routes bring what is published at the other brokers (docs/cluster.md).
    if (core_.interest != nullptr) entry.interest = core_.interest->acquire(pattern, {});
    entry = core_.index.add(pattern, entry);
    if (entry.interest != 0) core_.interest->activate(entry.interest);
    r.entries.emplace_back(pattern, entry);
  }
  index_entries_.fetch_add(static_cast<std::int64_t>(r.entries.size()), std::memory_order_relaxed);
  registered_[s.name] = std::move(r);
}

void StreamEngine::unregister_stream(Registered& r) {
  for (const auto& [pattern, entry] : r.entries) {
    core_.index.remove(pattern, entry);
    if (entry.interest != 0) core_.interest->release(entry.interest);
  }
  index_entries_.fetch_sub(static_cast<std::int64_t>(r.entries.size()), std::memory_order_relaxed);
  r.entries.clear();
}

void StreamEngine::reload(const config::StorageSettings& storage,
                          const std::vector<config::StreamSettings>& streams) {
  post(SetStorage{storage});
  std::map<std::string, const config::StreamSettings*> next;
  for (const auto& s : streams) next[s.name] = &s;
  // Removed first: a stream added in the same reload may take their subjects.
  // One `stream add` made stays; declared in the file now, the file has it.
  for (auto it = registered_.begin(); it != registered_.end();) {
    if (next.contains(it->first) || it->second.runtime) {
      if (it->second.runtime && next.contains(it->first)) {
        forget_runtime(directory_, it->first);
        it->second.runtime = false;
      }
      ++it;
      continue;
    }
    // Out of the index before the engine lets the store go: nothing routed
    // afterwards names it, and what was routed before is queued ahead.
    unregister_stream(it->second);
    post(RemoveStream{it->second.id});
    spdlog::info("stream {}: removed by the reload (its files stay in {}/{})", it->first, directory_,
                 it->first);
    {
      std::lock_guard lock(stats_mu_);
      stats_.erase(it->first);
    }
    it = registered_.erase(it);
  }
  std::vector<SetLimits> limits;
  for (const auto& [name, s] : next) {
    auto it = registered_.find(name);
    // The file's streams do not overlap each other (the configuration checks
    // that); one `stream add` made is not in the file: checked here.
    const auto taken = overlap(*s, /*runtime_only=*/true);
    if (it == registered_.end()) {
      if (taken) {
        spdlog::error("reload: stream {}: {}, a stream added at run time; the stream is left out", name,
                      *taken);
        continue;
      }
      const std::uint32_t id = next_id_++;
      auto stream = open(*s, id);
      if (!stream) {
        spdlog::error("reload: {}; the stream is left out", stream.error().message);
        continue;
      }
      post(AddStream{std::move(stream.value())});
      register_stream(*s, id);  // after the store is on its way: what is routed to it is queued behind it
      continue;
    }
    Registered& r = it->second;
    if (r.settings == *s) continue;
    const std::uint32_t id = r.id;
    if (r.settings.subjects != s->subjects && taken) {
      spdlog::error("reload: stream {}: {}, a stream added at run time; it keeps its subjects", name, *taken);
      config::StreamSettings kept = *s;
      kept.subjects = r.settings.subjects;
      r.settings = kept;
    } else if (r.settings.subjects != s->subjects) {
      unregister_stream(r);
      register_stream(*s, id);  // replaces r, settings included
      spdlog::info("stream {}: subjects now {}", name, fmt::join(s->subjects, ", "));
    } else {
      r.settings = *s;
    }
    limits.push_back({id, limits_of(*s), static_cast<std::int64_t>(s->duplicate_window_s) * kNsPerSecond,
                      s->duplicate_ids_max, registered_.at(name).settings.subjects});
  }
  // Last: once a new limit shows, every subject of the reload is in the
  // index (what a client publishes then goes to its stream).
  for (SetLimits& l : limits) post(std::move(l));
}

void StreamEngine::post(Item item) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(item));
  }
  wake_.notify_one();
}

void StreamEngine::capture(std::vector<StreamPublish>&& batch) { post(std::move(batch)); }

void StreamEngine::command(ConsumerCommand&& c) { post(std::move(c)); }

void StreamEngine::start() {
  ready_.resize(core_.options.workers);  // one PUB_ACK batch per worker
  thread_ = std::thread([this] {
    name_this_thread("rb-streams");
    run();
  });
}

void StreamEngine::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  for (auto& [name, r] : registered_) unregister_stream(r);
  registered_.clear();
  streams_.clear();
  std::lock_guard lock(mu_);
  queue_.clear();  // never started: the references go back to the pool now
}

void StreamEngine::apply(Item& item) {
  std::visit(
      [&](auto& i) {
        using T = std::decay_t<decltype(i)>;
        if constexpr (std::is_same_v<T, std::vector<StreamPublish>>) {
          handle(i);
        } else if constexpr (std::is_same_v<T, AddStream>) {
          const std::uint32_t id = i.stream.id;
          streams_.emplace(id, std::move(i.stream));
        } else if constexpr (std::is_same_v<T, RemoveStream>) {
          if (auto it = streams_.find(i.id); it != streams_.end()) {
            if (it->second.dirty) sync(it->second);
            save_consumers(it->second, true);
            close_store(it->second);
            std::erase_if(members_, [&](const auto& m) { return m.second.first == i.id; });
            const std::string dir = it->second.dir;
            streams_.erase(it);  // the store closes its files
            if (i.delete_files) delete_stream_files(dir);
          }
          if (i.done) i.done->set_value();
        } else if constexpr (std::is_same_v<T, SetLimits>) {
          if (auto it = streams_.find(i.id); it != streams_.end()) {
            it->second.store->set_limits(i.limits);
            it->second.duplicates.set_window(i.duplicate_window_ns, i.duplicate_ids_max);
            it->second.subjects = std::move(i.subjects);
            refresh(it->second);
          }
        } else if constexpr (std::is_same_v<T, ConsumerCommand>) {
          on_command(i);
        } else if constexpr (std::is_same_v<T, PurgeStream>) {
          on_purge(i);
        } else {
          storage_ = i.storage;
        }
      },
      item);
}

void StreamEngine::run() {
  std::int64_t next_expire = steady_ns() + kExpireEveryNs;
  for (;;) {
    std::deque<Item> items;
    bool stopping = false;
    {
      std::unique_lock lock(mu_);
      std::int64_t deadline = next_expire;
      if (consumers_due_ns_ != 0) deadline = std::min(deadline, consumers_due_ns_);
      if (first_dirty_ns_ != 0) {
        deadline = std::min(deadline, first_dirty_ns_ + std::int64_t{storage_.sync_interval_ms} * 1'000'000);
      }
      wake_.wait_until(lock, steady_clock::time_point(steady_clock::duration(deadline)),
                       [&] { return !queue_.empty() || stopping_; });
      items.swap(queue_);
      stopping = stopping_;
    }
    for (Item& item : items) apply(item);
    const std::int64_t now = steady_ns();
    // Group commit: a publisher waiting for its PUB_ACK is answered after the
    // next fdatasync, which runs as soon as the engine has taken what was
    // queued (what arrives meanwhile waits for it and shares the next);
    // messages nobody waits for are synced within sync_interval_ms.
    const bool acks_waiting =
        std::any_of(streams_.begin(), streams_.end(), [](const auto& e) { return !e.second.acks.empty(); });
    const bool sync_due = first_dirty_ns_ != 0 &&
                          (stopping || acks_waiting || storage_.sync == config::StreamSync::kAlways ||
                           now - first_dirty_ns_ >= std::int64_t{storage_.sync_interval_ms} * 1'000'000);
    if (sync_due) {
      first_dirty_ns_ = 0;
      for (auto& [id, s] : streams_) {
        if (!s.dirty) continue;
        sync(s);
        // A failed sync is tried again within sync_interval_ms: its
        // answers wait for it, whether or not anything new arrives.
        if (s.dirty && first_dirty_ns_ == 0) first_dirty_ns_ = now;
      }
    }
    if (now >= next_expire) {
      const std::int64_t wall = realtime_ns();
      for (auto& [id, s] : streams_) {
        if (s.store->expire(wall) > 0) refresh(s);
      }
      expire_inactive(now);
      next_expire = now + kExpireEveryNs;
    }
    if (stopping) {
      for (auto& [id, s] : streams_) {
        save_consumers(s, true);
        close_store(s);
      }
      return;  // the workers are gone, and their connections with them
    }
    serve_consumers(steady_ns());
    post_acks();
  }
}

void StreamEngine::handle(std::vector<StreamPublish>& batch) {
  const std::int64_t wall = realtime_ns(), now = steady_ns();
  for (const StreamPublish& p : batch) {
    auto it = streams_.find(p.stream);
    if (it != streams_.end()) {
      store_one(it->second, p, wall, now);
    } else if (p.ack_id != 0) {
      // Removed by a reload after the worker routed it (its entries were out
      // of the index before): the message was not the stream's to keep.
      ready_[p.publisher_worker].push_back(
          {p.publisher, p.publisher_slot, make_pub_ack(p.ack_id, proto::ErrorCode::kNoStream)});
      acks_due_ = true;
    }
  }
  for (auto& [id, s] : streams_) {
    write_staged(s);  // before the batch's buffers, which the staged records point into, go
    refresh(s);
  }
  std::int64_t charged = 0;
  for (const StreamPublish& p : batch) charged += p.backlog_charge;
  core_.slots->add_queued(core_.stream_slot, -charged);
  batch.clear();  // the buffers go back to the pool
}

void StreamEngine::write_staged(Stream& s) {
  if (s.staged_from == 0) return;
  const std::uint64_t from = s.staged_from, to = s.staged_to;
  s.staged_from = s.staged_to = 0;
  std::uint64_t lost = to + 1;
  if (auto r = s.store->flush(); !r) {
    // Not (wholly) written: the staged messages from `lost` on were not
    // stored, and their publishers are told so instead of being acknowledged.
    lost = std::min(r.error().lost_from, to + 1);
    if (lost <= to) {
      count_refused(s, r.error().code, to - lost + 1);
      log_throttled(refusal_log_, spdlog::level::warn, "stream {}: {} messages were not stored: {}",
                    s.stats->name, to - lost + 1, r.error().message);
    }
    // Refused in their place: their answers wait behind those of the
    // messages before them that were stored, which wait for the sync.
    refuse_from(s, lost, code_of(r.error().code));
  }
  s.stats->stored.add(lost - from);
  if (storage_.sync == config::StreamSync::kInterval) release_acks(s);  // written is enough
}

std::size_t StreamEngine::refuse_from(Stream& s, std::uint64_t from, proto::ErrorCode code) {
  s.duplicates.forget_from(from);
  std::size_t refused = 0;
  for (Ack& a : s.acks) {
    if (a.sequence < from) continue;  // stored before it, or refused already (sequence 0)
    a.code = code;
    a.sequence = 0;
    a.duplicate = false;
    ++refused;
  }
  return refused;
}

void StreamEngine::count_refused(Stream& s, store::StoreErrc code, std::uint64_t n) {
  switch (code) {
    case store::StoreErrc::kFull:
      s.stats->refused_full.add(n);
      break;
    case store::StoreErrc::kDiskFull:
      s.stats->refused_disk_full.add(n);
      break;
    case store::StoreErrc::kTooLarge:
      s.stats->refused_too_large.add(n);
      break;
    default:
      s.stats->write_errors.add(n);
      break;
  }
}

void StreamEngine::release_acks(Stream& s) {
  send_acks(s, s.acks);
  s.acks.clear();
}

void StreamEngine::send_acks(Stream& s, std::span<const Ack> acks) {
  if (acks.empty()) return;
  const std::string& name = s.stats->name;
  std::uint64_t frames = 0;
  const auto send = [&](const Ack& first, std::uint32_t count) {
    OutItem item = count > 1 ? make_pub_ack_range(first.ack_id, count, first.sequence, name)
                             : make_pub_ack(first.ack_id, first.code, first.sequence, name, first.duplicate);
    ready_[first.worker].push_back({first.connection, first.slot, std::move(item)});
    ++frames;
  };
  // The runs being extended, one per publisher at most (a publisher's
  // answers leave in its order: a run is sent before its next answer).
  std::vector<AckRun>& open = runs_;
  open.clear();
  for (const Ack& a : acks) {
    auto run = std::find_if(open.begin(), open.end(),
                            [&](const AckRun& r) { return r.first->connection == a.connection; });
    const bool stored = a.ranges && a.code == proto::ErrorCode::kNone && !a.duplicate;
    if (run != open.end() && stored && a.ack_id == run->first->ack_id + run->count &&
        a.sequence == run->first->sequence + run->count) {
      ++run->count;
      continue;
    }
    if (run != open.end()) {
      send(*run->first, run->count);
      open.erase(run);
    }
    if (stored) {
      open.push_back({&a, 1});
    } else {
      send(a, 1);
    }
  }
  for (const AckRun& r : open) send(*r.first, r.count);
  s.stats->acks.add(acks.size());
  s.stats->ack_frames.add(frames);
  acks_due_ = true;
}

void StreamEngine::store_one(Stream& s, const StreamPublish& p, std::int64_t realtime_now,
                             std::int64_t steady_now) {
  proto::Frame f;
  const std::span<const std::byte> bytes(p.buf.data() + p.frame.offset, p.frame.len);
  if (proto::decode_frame(bytes, bytes.size(), f) != proto::DecodeStatus::kOk)
    return;  // validated by the worker
  // The broker's receive time: the worker's steady stamp, on the wall clock.
  const std::int64_t received = realtime_now - (steady_now - p.received_at);
  const std::string_view msg_id = msg_id_of(f.headers);
  if (msg_id.size() > proto::kMaxMsgIdLen) {
    // Not stored: a stream remembers ids of a bounded size (SPEC.md §3.10).
    s.stats->refused_msg_id.add();
    log_throttled(refusal_log_, spdlog::level::warn,
                  "stream {}: a message on {} was not stored: its Msg-Id is {} bytes, at most {} are taken",
                  s.stats->name, f.subject, msg_id.size(), proto::kMaxMsgIdLen);
    return answer(s, p,
                  p.publisher_version >= proto::kMsgIdCodeVersion ? proto::ErrorCode::kMsgIdInvalid
                                                                  : proto::ErrorCode::kPayloadTooLarge);
  }
  if (auto first = s.duplicates.find(msg_id, received)) {
    s.stats->duplicates.add();
    return answer(s, p, proto::ErrorCode::kNone, *first, true);
  }
  // Staged: written with the rest of the batch by flush(), and counted then.
  auto r = s.store->stage({f.subject, f.headers, f.payload}, received);
  if (r) {
    if (s.staged_from == 0) s.staged_from = r.value();
    s.staged_to = r.value();
    s.duplicates.add(msg_id, r.value(), received);
    if (!s.dirty && first_dirty_ns_ == 0) first_dirty_ns_ = steady_now;
    s.dirty = true;
    return answer(s, p, proto::ErrorCode::kNone, r.value());
  }
  count_refused(s, r.error().code, 1);
  log_throttled(refusal_log_, spdlog::level::warn, "stream {}: a message on {} was not stored: {}",
                s.stats->name, f.subject, r.error().message);
  answer(s, p, code_of(r.error().code));
}

void StreamEngine::answer(Stream& s, const StreamPublish& p, proto::ErrorCode code, std::uint64_t sequence,
                          bool duplicate) {
  if (p.ack_id == 0) return;
  const Ack ack{
      p.publisher_worker, p.publisher, p.publisher_slot, p.ack_id,
      sequence,           code,        duplicate,        p.publisher_version >= proto::kAckRangesVersion};
  // Behind the batch's staged messages until they are written, and behind
  // the stream's unsynced ones (a duplicate's first may be one of them)
  // unless written is enough (sync: interval).
  if (s.staged_from != 0 || (s.dirty && storage_.sync != config::StreamSync::kInterval)) {
    s.acks.push_back(ack);
    return;
  }
  send_acks(s, std::span(&ack, 1));
}

void StreamEngine::post_acks() {
  if (!acks_due_) return;
  // Queued, not lent: posting a worker's SENDs (rxe runs each inline) would
  // keep the engine from the next batch while the worker sleeps. Measured
  // in the Soft-RoCE guest, durable publishing at 512 unanswered, three
  // alternating pairs in one boot: lent 63,942 / 88,884 / 63,757 msg/s,
  // queued 104,722 / 79,311 / 98,835 (docs/streams.md, "How it runs").
  core_.workers->post_deliveries(ready_, WorkerDispatch::Handoff::kQueue);
  acks_due_ = false;
}

void StreamEngine::sync(Stream& s) {
  const auto started = steady_clock::now();
  if (auto r = s.store->sync(); !r) {
    s.stats->write_errors.add();
    // What was written since the last good sync is in doubt: a failed
    // fdatasync may leave those pages clean but never written, and reports
    // its error once, so a later sync that succeeds proves nothing for them.
    // Nothing in doubt is acknowledged: its publishers get INTERNAL_ERROR,
    // and its Msg-Ids are forgotten, so that a retry is stored again (the
    // first copy may survive: at least once). The stream stays dirty, so
    // what comes next is synced as usual.
    const std::size_t refused =
        refuse_from(s, s.store->stats().durable_sequence + 1, proto::ErrorCode::kInternalError);
    log_throttled(refusal_log_, spdlog::level::err,
                  "stream {}: sync failed: {}; {} acknowledged publishes waiting on it are refused",
                  s.stats->name, r.error().message, refused);
    release_acks(s);
    return;
  }
  s.stats->syncs.add();
  s.stats->sync_seconds.observe(std::chrono::duration<double>(steady_clock::now() - started).count());
  s.dirty = false;
  release_acks(s);  // what they acknowledge is durable now
}

void StreamEngine::refresh(Stream& s) {
  const store::StoreStats st = s.store->stats();
  StreamStats& m = *s.stats;
  m.messages.set(static_cast<std::int64_t>(st.messages));
  m.bytes.set(static_cast<std::int64_t>(st.bytes));
  m.first_sequence.set(static_cast<std::int64_t>(st.first_sequence));
  m.last_sequence.set(static_cast<std::int64_t>(st.last_sequence));
  m.subjects.set(static_cast<std::int64_t>(st.subjects));
  m.segments.set(static_cast<std::int64_t>(st.segments));
  m.disk_bytes.set(static_cast<std::int64_t>(st.disk_bytes));
  m.corrupt_records.set(static_cast<std::int64_t>(st.corrupt_records));
  m.torn_bytes.set(static_cast<std::int64_t>(st.torn_bytes));
  m.duplicate_ids.set(static_cast<std::int64_t>(s.duplicates.size()));
  m.duplicate_ids_evicted.add(s.duplicates.take_evicted());
  if (st.removed_by_limits > m.removed_by_limits.get())
    m.removed_by_limits.add(st.removed_by_limits - m.removed_by_limits.get());
}

}  // namespace rdmabroker::daemon
