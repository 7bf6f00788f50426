// SPDX-License-Identifier: Apache-2.0
// What a stream keeps beside its messages, and its store's end: the
// duplicate window saved where a restart finds it (docs/streams.md,
// "Acknowledged publishing"), and the store's orderly close.
#include <spdlog/spdlog.h>

#include <ctime>
#include <fstream>
#include <iterator>

#include "store/segment.hpp"
#include "stream/engine.hpp"

namespace rdmabroker::daemon {
namespace {

constexpr const char* kDuplicatesFile = "/duplicates.bin";

/// Fills `window` with the Msg-Ids of the last `window`'s worth of
/// messages: those the snapshot in `dir` kept (of messages the limits or a
/// purge removed since), then those of every record still in the files,
/// removed by the limits or not.
void rebuild(DuplicateWindow& window, store::MessageStore& store, const std::string& dir,
             std::int64_t now_ns) {
  if (!window.enabled()) return;
  if (std::ifstream in(dir + kDuplicatesFile, std::ios::binary); in) {
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!window.restore(bytes, now_ns))
      spdlog::warn("{}{} is damaged: the Msg-Ids of removed messages are not remembered", dir,
                   kDuplicatesFile);
  }
  store.scan_since(now_ns - window.window_ns(), [&](const store::RecordView& r) {
    // One a snapshot brought back already is not added twice (its place in the order is its time's).
    const std::string_view id = msg_id_of(r.headers);
    if (!window.contains(id)) window.add(id, r.sequence, r.time_ns);
  });
}

}  // namespace

void StreamEngine::restore_duplicates(Stream& s) {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  rebuild(s.duplicates, *s.store, s.dir, std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
}

void StreamEngine::save_duplicates(Stream& s) {
  if (!s.duplicates.enabled()) return;
  if (auto st = store::replace_file(s.dir + kDuplicatesFile, s.duplicates.snapshot()); !st) {
    log_throttled(
        refusal_log_, spdlog::level::err,
        "stream {}: the Msg-Ids of messages about to be removed could not be saved ({}): a retry of "
        "one after a restart may be stored again",
        s.stats->name, st.error().message);
  }
}

void StreamEngine::close_store(Stream& s) {
  save_duplicates(s);
  if (auto st = s.store->close(); !st) {
    spdlog::warn(
        "stream {}: not closed cleanly ({}): its next start goes on after the sequences it had reserved",
        s.stats->name, st.error().message);
  }
}

}  // namespace rdmabroker::daemon
