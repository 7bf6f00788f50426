// SPDX-License-Identifier: Apache-2.0
// The stream engine's statistics: each stream's under its name ("stream.
// ORDERS.messages"), exported with the label stream="ORDERS".
#include "stream/engine.hpp"

namespace rdmabroker::daemon {

void StreamStats::visit(StatsVisitor& v) const {
  const std::string k = "stream." + name + ".";
  const auto count = [&](const char* key, const Counter& c, std::string_view metric, std::string_view help) {
    v.counter({k + key, metric, help, "stream", name}, c.get());
  };
  const auto level = [&](const char* key, const Gauge& g, std::string_view metric, std::string_view help) {
    v.gauge({k + key, metric, help, "stream", name}, g.get());
  };
  count("stored", stored, "rdmabroker_stream_stored_total", "Messages appended to the stream.");
  count("refused_full", refused_full, "rdmabroker_stream_refused_full_total",
        "Messages refused by a stream at its limits (discard: new).");
  count("refused_disk_full", refused_disk_full, "rdmabroker_stream_refused_disk_full_total",
        "Messages a stream could not store because the file system was full.");
  count("refused_too_large", refused_too_large, "rdmabroker_stream_refused_too_large_total",
        "Messages above a stream's max_msg_size.");
  count("refused_msg_id", refused_msg_id, "rdmabroker_stream_refused_msg_id_total",
        "Messages a stream refused for a Msg-Id longer than 128 bytes.");
  count("write_errors", write_errors, "rdmabroker_stream_write_errors_total",
        "I/O errors of a stream's appends and syncs (other than a full disk).");
  count("removed_by_limits", removed_by_limits, "rdmabroker_stream_removed_by_limits_total",
        "Messages a stream's retention removed (max_msgs, max_bytes, max_age_s, max_msgs_per_subject).");
  count("syncs", syncs, "rdmabroker_stream_syncs_total", "fdatasync calls of a stream's store.");
  count("duplicates", duplicates, "rdmabroker_stream_duplicates_total",
        "Messages whose Msg-Id a stream stored within its duplicate window: not stored again.");
  count("duplicate_ids_evicted", duplicate_ids_evicted, "rdmabroker_stream_duplicate_ids_evicted_total",
        "Msg-Ids a stream forgot before its duplicate window passed, because it held duplicate_ids_max.");
  level("duplicate_ids", duplicate_ids, "rdmabroker_stream_duplicate_ids",
        "Msg-Ids a stream's duplicate window remembers.");
  count("acks", acks, "rdmabroker_stream_acks_total",
        "Acknowledged publishes a stream answered (stored, duplicate or refused).");
  count("ack_frames", ack_frames, "rdmabroker_stream_ack_frames_total",
        "PUB_ACK frames a stream sent: one per answer, or one per run of a publisher's stored messages.");
  count("delivered", delivered, "rdmabroker_stream_consumer_delivered_total",
        "Messages a stream's consumers delivered (redeliveries included).");
  count("redelivered", redelivered, "rdmabroker_stream_consumer_redelivered_total",
        "Messages a stream's consumers delivered again (deadline passed, NAK, member gone, restart).");
  count("consumer_acks", consumer_acks, "rdmabroker_stream_consumer_acks_total",
        "Messages a stream's consumers had acknowledged.");
  count("max_deliveries", max_deliveries, "rdmabroker_stream_consumer_max_deliveries_total",
        "Messages a stream's consumers gave up after max_deliver deliveries (each advised).");
  count("consumer_denied", consumer_denied, "rdmabroker_stream_consumer_denied_total",
        "Messages a stream's consumers passed over because no member's user may receive their subject.");
  count("consumer_resets", consumer_resets, "rdmabroker_stream_consumer_resets_total",
        "Durable consumers found at start beyond their stream's last sequence (its files lost or replaced), "
        "started again from its first message.");
  count("consumers_expired", consumers_expired, "rdmabroker_stream_consumers_expired_total",
        "Durable consumers removed after limits.consumer_inactive_threshold_s without a member.");
  count("consumer_save_errors", consumer_save_errors, "rdmabroker_stream_consumer_save_errors_total",
        "Writes of a durable consumer's state that failed (a full disk, an I/O error), each tried again "
        "within 50 ms.");
  level("consumers", consumers, "rdmabroker_stream_consumers",
        "A stream's consumers (durable and ephemeral).");
  level("consumer_pending", consumer_pending, "rdmabroker_stream_consumer_pending",
        "Messages a stream's consumers delivered and have not had acknowledged.");
  level("messages", messages, "rdmabroker_stream_messages", "Messages a stream holds.");
  level("bytes", bytes, "rdmabroker_stream_bytes",
        "Bytes of the messages a stream holds (records, headers included).");
  level("first_sequence", first_sequence, "rdmabroker_stream_first_sequence",
        "A stream's first live sequence (last + 1 when empty).");
  level("last_sequence", last_sequence, "rdmabroker_stream_last_sequence", "A stream's last sequence.");
  level("subjects", subjects, "rdmabroker_stream_subjects", "Distinct subjects of a stream's messages.");
  level("segments", segments, "rdmabroker_stream_segments", "A stream's segment files.");
  level("disk_bytes", disk_bytes, "rdmabroker_stream_disk_bytes", "Bytes of a stream's segment files.");
  level("corrupt_records", corrupt_records, "rdmabroker_stream_corrupt_records",
        "Damaged records found in a stream (at start or on read) and skipped.");
  level("torn_bytes", torn_bytes, "rdmabroker_stream_torn_bytes",
        "Bytes of an unfinished write cut off a stream's end at start.");
  HistogramSnapshot h;
  h.add(sync_seconds);
  v.histogram({"", "rdmabroker_stream_sync_seconds", "Seconds one fdatasync of a stream's store took.",
               "stream", name},
              h);
}

void StreamEngine::visit(StatsVisitor& v) const {
  std::vector<std::shared_ptr<StreamStats>> streams;
  {
    std::lock_guard lock(stats_mu_);
    for (const auto& [name, s] : stats_) streams.push_back(s);
  }
  v.level("streams.count", static_cast<std::int64_t>(streams.size()), "rdmabroker_streams",
          "Streams the broker keeps.");
  v.level("streams.backlog", core_.slots->queued(core_.stream_slot), "rdmabroker_streams_backlog",
          "Receive buffers that messages routed to streams and not stored yet pin.");
  for (const auto& s : streams) s->visit(v);
}

}  // namespace rdmabroker::daemon
