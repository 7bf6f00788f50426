// SPDX-License-Identifier: Apache-2.0
// The stream engine (docs/streams.md): every stream's store, on a thread of
// its own. Workers route each publish whose subject a stream takes to it
// (the stream's entries in the subscription index, broker/streams.hpp); the
// engine appends it to the stream's store, syncs the stores by the storage
// settings (a group commit within sync_interval_ms, or every batch), and
// expires messages past a stream's max_age once a second.
//
// Threads: create() and reload() run on the main thread: they open stores
// (so a stream that cannot be opened is an error for the operator at once)
// and keep the index entries; the stores then belong to the engine thread,
// which takes them, with the captured messages, from one queue in order.
// Statistics are atomics the engine writes and anyone reads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <future>
#include <span>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "broker/core.hpp"
#include "broker/log_throttle.hpp"
#include "broker/outbound.hpp"
#include "broker/stats.hpp"
#include "broker/streams.hpp"
#include "stream/consumer.hpp"
#include "stream/duplicates.hpp"
#include "rdmabroker/config/settings.hpp"
#include "rdmabroker/result.hpp"
#include "store/message_store.hpp"

namespace rdmabroker::daemon {

/// Seconds one fdatasync of a stream's store took.
inline constexpr std::array<double, 12> kStreamSyncBounds = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3,
                                                             5e-3,  10e-3,  25e-3,  50e-3,  100e-3, 1.0};

/// One stream's statistics (the engine thread is the only writer).
struct StreamStats {
  explicit StreamStats(std::string n) : name(std::move(n)) {}
  void visit(StatsVisitor& v) const;  // engine_stats.cpp

  const std::string name;
  Counter stored;             // messages appended
  Counter refused_full;       // discard: new, at the limits
  Counter refused_disk_full;  // the file system was full
  Counter refused_too_large;  // above max_msg_size
  Counter refused_msg_id;     // a Msg-Id longer than proto::kMaxMsgIdLen
  Counter write_errors;       // other I/O errors on append or sync
  Counter removed_by_limits;
  Counter syncs;
  Counter duplicates;             // messages with a Msg-Id stored within the window: not stored again
  Counter duplicate_ids_evicted;  // ids forgotten early: the window held duplicate_ids_max
  Gauge duplicate_ids;            // ids the window remembers
  Counter acks;                   // acknowledged publishes answered (stored, duplicate or refused)
  Counter ack_frames;             // PUB_ACK frames that carried them (a range answers a run of messages)
  // Its consumers' (SPEC.md §3.11), summed.
  Counter delivered, redelivered, consumer_acks, max_deliveries;
  Counter consumer_denied;       // passed over: no member's user may receive the subject
  Counter consumer_resets;       // durable consumers found beyond the stream's last sequence, reset
  Counter consumers_expired;     // durable consumers removed after consumer_inactive_threshold_s unused
  Counter consumer_save_errors;  // writes of a durable consumer's state that failed (each tried again)
  Gauge consumers, consumer_pending;
  Gauge messages, bytes, first_sequence, last_sequence, subjects, segments, disk_bytes, corrupt_records,
      torn_bytes;
  Histogram<kStreamSyncBounds.size()> sync_seconds{kStreamSyncBounds};
};

class StreamEngine final : public StreamCapture {
 public:
  /// Opens every stream's store under storage.directory (each in a
  /// directory of its name); the error names the stream and what failed.
  static Result<std::unique_ptr<StreamEngine>> create(BrokerCore& core,
                                                      const config::StorageSettings& storage,
                                                      const std::vector<config::StreamSettings>& streams);
  ~StreamEngine() override;
  StreamEngine(const StreamEngine&) = delete;
  StreamEngine& operator=(const StreamEngine&) = delete;

  void start();
  /// Stores what is queued, syncs every store and joins the thread. Idempotent.
  void stop();
  void capture(std::vector<StreamPublish>&& batch) override;
  void command(ConsumerCommand&& c) override;
  /// The live settings of a reload: streams added (opened now: a failure is
  /// logged and that stream left out), removed (the files stay), their
  /// subjects and limits changed; the sync policy.
  void reload(const config::StorageSettings& storage, const std::vector<config::StreamSettings>& streams);
  /// Every stream's statistics, and the engine's backlog.
  void visit(StatsVisitor& v) const;

  // Run-time management (`rdmabroker stream ...`: stream/engine_admin.cpp), main thread.
  struct Listing {
    config::StreamSettings settings;
    bool runtime = false;  // added by `stream add`, not declared in the configuration file
    std::shared_ptr<StreamStats> stats;
  };
  std::vector<Listing> list() const;
  /// A stream not in the configuration file: opened and taking its subjects
  /// now, kept (its directory's stream.json) across restarts until removed.
  Status add(const config::StreamSettings& s);
  /// Removes a stream `add` made, and deletes its files.
  Status remove(const std::string& name);
  /// Removes every message of a stream (sequences go on); how many.
  Result<std::uint64_t> purge(const std::string& name);
  /// The subscription index entries the streams hold (one per subject
  /// pattern): not subscriptions of clients. Any thread.
  std::int64_t index_entries() const { return index_entries_.load(std::memory_order_relaxed); }

 private:
  /// An answer to an acknowledged PUBLISH, for the publisher's worker to send.
  struct Ack {
    std::uint32_t worker = 0;  // the publisher's worker, connection and slot
    std::uint64_t connection = 0;
    std::uint32_t slot = 0;
    std::uint64_t ack_id = 0;    // the publisher's id of the message
    std::uint64_t sequence = 0;  // the stream sequence it acknowledges (0: not stored)
    proto::ErrorCode code = proto::ErrorCode::kNone;
    bool duplicate = false;
    bool ranges = false;  // the publisher takes PUB_ACK ranges (version 12)
  };
  /// A stream as the engine thread holds it.
  struct Stream {
    std::uint32_t id = 0;
    std::unique_ptr<store::MessageStore> store;
    std::shared_ptr<StreamStats> stats;
    DuplicateWindow duplicates;
    bool dirty = false;             // appended since the last sync
    std::uint64_t staged_from = 0;  // the first sequence staged in this batch (0: none)
    std::uint64_t staged_to = 0;    // and the last
    std::vector<Ack> acks;  // for messages staged or appended since the last sync: sent once it succeeds
    std::string dir;        // its files' directory
    std::vector<std::string> subjects;  // its patterns (a consumer's user must be able to read one)
    std::map<std::string, std::unique_ptr<Consumer>> consumers;  // by name
  };
  /// A stream as the main thread registers it: its index entries.
  struct Registered {
    std::uint32_t id = 0;
    config::StreamSettings settings;
    bool runtime = false;  // added by `stream add` (stream.json in its directory)
    std::vector<std::pair<std::string, Subscriber>> entries;  // pattern, index entry
  };
  struct AddStream {
    Stream stream;
  };
  struct RemoveStream {
    std::uint32_t id = 0;
    bool delete_files = false;                 // `stream rm`
    std::shared_ptr<std::promise<void>> done;  // `stream rm` waits for its files to go
  };
  struct PurgeStream {
    std::uint32_t id = 0;
    std::shared_ptr<std::promise<Result<std::uint64_t>>> done;
  };
  struct SetLimits {
    std::uint32_t id = 0;
    store::StoreLimits limits;
    std::int64_t duplicate_window_ns = 0;
    std::size_t duplicate_ids_max = 0;
    std::vector<std::string> subjects;
  };
  struct SetStorage {
    config::StorageSettings storage;
  };
  using Item = std::variant<std::vector<StreamPublish>, AddStream, RemoveStream, SetLimits, SetStorage,
                            ConsumerCommand, PurgeStream>;
  /// Deliveries of one consumer's turn to one member, being filled.
  struct Batch {
    BufferRef buf;
    std::uint32_t used = 0;  // bytes of buf filled
    OutItem item;            // the DELIVER being extended (item.body empty: none yet)
  };

  StreamEngine(BrokerCore& core, const config::StorageSettings& storage)
      : core_(core), directory_(storage.directory), storage_(storage) {}
  /// Opens `s`'s store (main thread).
  Result<Stream> open(const config::StreamSettings& s, std::uint32_t id);
  /// Enters `s`'s subjects in the subscription index (main thread).
  void register_stream(const config::StreamSettings& s, std::uint32_t id);
  void unregister_stream(Registered& r);
  /// Which registered stream's subjects overlap `s`'s (other than `s` itself;
  /// `runtime_only`: among those `add` made), if any.
  std::optional<std::string> overlap(const config::StreamSettings& s, bool runtime_only = false) const;
  /// Opens the streams `add` made in an earlier run (create()).
  void open_runtime_streams();
  void on_purge(PurgeStream& p);
  void post(Item item);

  // The engine thread.
  void run();
  /// One item of the queue: a batch to store, or a change from the main thread.
  void apply(Item& item);
  void handle(std::vector<StreamPublish>& batch);
  void store_one(Stream& s, const StreamPublish& p, std::int64_t realtime_now, std::int64_t steady_now);
  void sync(Stream& s);
  /// The store's orderly end (MessageStore::close); a failure is logged.
  void close_store(Stream& s);
  /// Keeps `s`'s duplicate window in its directory (before messages whose
  /// records held those Msg-Ids leave the files: a purge, a segment dropped,
  /// a stop), so that a restart remembers them for their whole window.
  void save_duplicates(Stream& s);
  /// Fills `s`'s duplicate window as it opens (stream/engine_duplicates.cpp).
  void restore_duplicates(Stream& s);
  /// Writes what the batch staged in `s`; refuses what could not be written.
  void write_staged(Stream& s);
  void count_refused(Stream& s, store::StoreErrc code, std::uint64_t n);
  /// The waiting answers of `s`'s messages from sequence `from` on become
  /// refusals with `code`, in their place (SPEC.md §3.10 rule 1), and their
  /// Msg-Ids are forgotten, so that a retry is stored again. How many.
  std::size_t refuse_from(Stream& s, std::uint64_t from, proto::ErrorCode code);
  /// Sends the acknowledgements `s` holds.
  void release_acks(Stream& s);
  /// Hands `acks` (answers of stream `s`, in order) to their workers: a run
  /// of one publisher's stored messages whose ids and sequences both go up
  /// by one as a single PUB_ACK with RANGE, when the publisher takes them.
  void send_acks(Stream& s, std::span<const Ack> acks);
  void refresh(Stream& s);
  /// Answers PUBLISH `p` (if it asked for an ACK): after `s`'s next sync
  /// when `s` has unsynced messages, else with the next post.
  void answer(Stream& s, const StreamPublish& p, proto::ErrorCode code, std::uint64_t sequence = 0,
              bool duplicate = false);
  /// Hands the PUB_ACKs that are due to the publishers' workers.
  void post_acks();

  // stream/engine_consumers.cpp: consumers (SPEC.md §3.11).
  void on_command(ConsumerCommand& c);
  void open_consumer(const ConsumerCommand& c);
  /// The durable consumers saved in `stream`'s directory, as it opens;
  /// one beyond the stream's last sequence starts again from its first.
  void load_durables(Stream& stream, const std::string& name);
  /// Why `who` may not be a member of `k` (a consumer of `s`), or nothing:
  /// it must be able to read some subject of the stream, and a durable
  /// consumer must be its own or one streams.join grants it.
  std::optional<std::string> refusal(const Stream& s, const Consumer& k, const Identity& who) const;
  /// A reload's new permissions for a member: it goes on under them, or
  /// leaves the consumer with PERMISSION_DENIED if they no longer admit it.
  void renew_member(const ConsumerCommand& c);
  /// Why a new consumer of `s` (`durable` for `who`) would pass a limit
  /// (limits.max_consumers_per_stream, max_consumers_total,
  /// max_durables_per_user), or nothing.
  std::optional<std::string> over_limits(const Stream& s, bool durable, const Identity& who) const;
  /// Removes the durable consumers without a member for
  /// limits.consumer_inactive_threshold_s, and their files.
  void expire_inactive(std::int64_t now);
  void refuse(const ConsumerCommand& c, proto::ErrorCode code, std::string why);
  void close_member(std::uint64_t connection, std::uint32_t sid);
  /// Expires deadlines and delivers what every consumer may take now.
  void serve_consumers(std::int64_t now);
  /// One consumer's turn; false when it stopped short (no pool buffer, or its share of the turn).
  bool serve(Stream& s, Consumer& k, std::int64_t now, std::int64_t wall);
  /// Reads message `p` into the member's batch; false when no pool buffer was free.
  bool deliver(Stream& s, Consumer& k, const Consumer::Pick& p, Batch& b, std::int64_t now);
  void flush(const ConsumerMember& m, Batch& b);
  /// The outstanding bytes one member may have: within half its
  /// connection's pool share and half its queue bound.
  std::uint64_t member_byte_limit() const;
  void to_client(std::uint32_t worker, std::uint64_t connection, std::uint32_t slot, OutItem item);
  /// An advisory on $RB.ADVISORY.MAX_DELIVERIES.<stream>.<consumer> (JSON).
  void advise(const Stream& s, const Consumer& k, const Consumer::GivenUp& g);
  /// Saves the durable consumers that changed (every 50 ms, or `all` now).
  void save_consumers(Stream& s, bool all);
  void refresh_consumers(Stream& s);
  Stream* stream_named(std::string_view name);

  BrokerCore& core_;
  const std::string directory_;  // storage.directory (not live)
  // Main thread: what create() and reload() registered, by name.
  std::map<std::string, Registered> registered_;
  std::uint32_t next_id_ = 1;
  std::atomic<std::int64_t> index_entries_{0};

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_

  // The engine thread's (create() fills streams_ before it starts).
  std::map<std::uint32_t, Stream> streams_;
  config::StorageSettings storage_;
  std::int64_t first_dirty_ns_ = 0;
  std::vector<std::vector<RemoteDelivery>> ready_;  // PUB_ACKs due, per worker
  struct AckRun {
    const Ack* first;
    std::uint32_t count;
  };
  std::vector<AckRun> runs_;  // send_acks()'s, kept for its capacity
  bool acks_due_ = false;     // ready_ holds something for post_acks() to post
  LogThrottle refusal_log_;
  /// Each consumer member: (connection, sid) -> (stream id, consumer name).
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::pair<std::uint32_t, std::string>> members_;
  std::int64_t consumers_due_ns_ = 0;  // steady: when the consumers need a turn again (0: on the next item)
  std::int64_t consumers_saved_ns_ = 0;

  mutable std::mutex stats_mu_;
  std::map<std::string, std::shared_ptr<StreamStats>> stats_;  // guarded by stats_mu_; by stream name

  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace rdmabroker::daemon
