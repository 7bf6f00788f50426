// SPDX-License-Identifier: Apache-2.0
// Routes: what comes back from the other brokers. Each route's I/O thread
// polls its client; each message it takes is written as PUBLISH frames (or
// fragments) into pool buffers and handed to the workers of the local
// subscribers whose interest the route carried (routes.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "cluster/route.hpp"
#include "cluster/routes.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

namespace {

/// How long a route's I/O thread waits for a pool buffer before it counts
/// the message as dropped: waiting holds the route (its broker stops sending
/// once the credits run out), which is the back-pressure we want.
constexpr int kPoolWaitMs = 1000;
/// How long an idle route's poller sleeps in one poll(): data, end() (a
/// wake()) and the route thread's own waits on the client end it sooner,
/// so nothing depends on it; a minute only bounds a wake-up that got lost.
constexpr auto kIdlePoll = std::chrono::seconds(60);

}  // namespace

void Routes::poll(Route& r) {
  while (!r.stopping.load()) {
    // Returns as soon as something arrived and was handed to on_message,
    // when end() wakes it, or when the route thread waits on the client
    // (confirm(), a subscribe waiting for a send buffer) and needs the turn.
    // An idle route's poller sleeps: the timeout is a backstop only.
    auto taken = r.client->poll(kIdlePoll);
    hand_over_taken(r);
    if (!taken && taken.error().kind == ErrorKind::kClosed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // closed for good: end() comes
    }
  }
}

void Routes::hand_over_taken(Route& r) {
  std::lock_guard io(r.io_mu);
  hand_over(r);
}

void Routes::hand_over(Route& r) {
  if (std::any_of(r.batches.begin(), r.batches.end(), [](const auto& b) { return !b.empty(); }))
    workers_.post_deliveries(r.batches);
  if (!r.channel_batch.empty()) core_.multicast->publish(std::exchange(r.channel_batch, {}));
}

std::vector<Subscriber> Routes::recipients(Route& r, std::uint32_t entry, const std::string& group,
                                           std::string_view subject) {
  std::vector<Subscriber> out;
  Match& match = r.match_cache.match(core_.index, subject);
  // Only the local subscriptions this entry stands for (one hop: never a
  // route's, and never one another entry brings its own copy to). A
  // multicast channel stands for all of its members.
  auto ours = [&](const Subscriber& s) { return !s.route && s.interest == entry; };
  if (group.empty()) {
    for (const Subscriber& s : match.plain)
      if (ours(s)) out.push_back(s);
    return out;
  }
  // The other broker chose this one for the group: one member of it here.
  std::vector<const Subscriber*> members;
  for (const auto& g : match.groups)
    for (const Subscriber& s : g)
      if (ours(s)) members.push_back(&s);
  if (!members.empty()) out.push_back(*members[r.next_member[entry]++ % members.size()]);
  return out;
}

std::byte* Routes::room(Route& r, std::uint32_t len, std::string_view subject) {
  if (r.buffer && r.used + len <= core_.options.buffer_size) return r.buffer.data() + r.used;
  r.buffer.reset();
  r.used = 0;
  // What was handed over holds the buffers it references: hand it over now,
  // so that sends (and their buffers' return) can begin while we wait.
  hand_over(r);
  std::uint32_t index = 0;
  // The reserve is left to the receive queues (broker/pool_shares.hpp).
  for (int waited = 0; core_.pool->acquire(&index, 1, core_.pool_shares.reserve()) == 0; ++waited) {
    if (waited == kPoolWaitMs) {
      if (r.dropped.fetch_add(1) == 0)
        spdlog::warn("route {}: no pool buffer for {} ms; a message to '{}' was dropped (counted)", r.url,
                     kPoolWaitMs, subject);
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  r.buffer = BufferRef(core_.pool, index);
  return r.buffer.data();
}

namespace {

/// m's header block as it goes on the wire: the view's own bytes, or (a
/// view of an owning Message) the block made again into `encoded`.
std::span<const std::byte> header_block_of(const MessageView& m, std::vector<std::byte>& encoded) {
  std::span<const std::byte> block = m.header_block();
  if (!block.empty() || !m.has_headers()) return block;
  const Headers headers = m.headers();
  std::vector<proto::HeaderField> fields;
  for (const auto& [name, value] : headers) fields.push_back({name, value});
  encoded.resize(proto::header_block_len(fields));
  proto::encode_header_block(encoded.data(), fields);
  return encoded;
}

/// Writes PUBLISH frame `h` at `p`: the strings in the first, then `chunk`
/// of the message's bytes from `offset` (the header block, then the
/// payload), zero padding to `len`.
void write_publish(std::byte* p, const proto::FrameHeader& h, const MessageView& m,
                   std::span<const std::byte> block, std::size_t offset, std::size_t chunk,
                   std::uint32_t len) {
  proto::encode_header(p, h);
  std::size_t at = proto::kHeaderSize;
  if (offset == 0) {
    std::memcpy(p + at, m.subject.data(), m.subject.size());
    at += m.subject.size();
    if (!m.reply.empty()) std::memcpy(p + at, m.reply.data(), m.reply.size());
    at += m.reply.size();
  }
  for (std::size_t from = offset, n = chunk; n > 0;) {
    const bool in_block = from < block.size();
    const std::byte* src = in_block ? block.data() + from : m.payload.data() + (from - block.size());
    const std::size_t piece =
        std::min(n, in_block ? block.size() - from : m.payload.size() - (from - block.size()));
    std::memcpy(p + at, src, piece);
    at += piece;
    from += piece;
    n -= piece;
  }
  std::memset(p + at, 0, len - at);
}

}  // namespace

void Routes::on_message(Route& r, std::uint32_t entry, const std::string& group, const MessageView& m) {
  std::lock_guard io(r.io_mu);
  std::vector<std::byte> encoded;
  const std::span<const std::byte> block = header_block_of(m, encoded);
  // The message as PUBLISH frames in pool buffers, back to back: one whole
  // frame, or fragments (SPEC.md §3.7) when it is larger than a frame, with
  // the route's own publisher id so that a subscriber fed by two routes at
  // once reassembles each message apart.
  const std::size_t message_len = block.size() + m.payload.size();
  const std::size_t strings = m.subject.size() + m.reply.size();
  const std::size_t max_frame =
      proto::max_publish_frame(core_.options.buffer_size) & ~(proto::kFrameAlign - 1);
  const bool whole = proto::align_up(proto::kHeaderSize + strings + message_len) <= max_frame;
  if (!whole && (message_len > core_.options.max_payload ||
                 strings + block.size() + 8 > max_frame - proto::kHeaderSize)) {
    if (r.dropped.fetch_add(1) == 0)
      spdlog::warn(
          "route {}: a message of {} bytes to '{}' exceeds this broker's limits.max_payload ({}) "
          "or leaves no room in a first fragment; dropped (counted)",
          r.url, message_len, m.subject, core_.options.max_payload);
    return;
  }
  std::vector<Subscriber> to = recipients(r, entry, group, m.subject);
  r.messages_in.fetch_add(1, std::memory_order_relaxed);
  r.bytes_in.fetch_add(m.payload.size(), std::memory_order_relaxed);
  if (!whole && std::erase_if(to, [](const Subscriber& s) { return s.worker == kChannelWorker; }) > 0) {
    // A channel sequences whole messages into datagrams (SPEC.md §7), as for
    // a local publisher's message in fragments: counted, logged once.
    if (r.dropped.fetch_add(1) == 0)
      spdlog::warn(
          "route {}: a message of {} bytes to multicast subject '{}' needs fragments, which a "
          "multicast channel does not carry; its channel's members get none (counted)",
          r.url, message_len, m.subject);
  }
  if (to.empty()) return;  // its subscriber left meanwhile: nobody here wants it now
  for (std::size_t offset = 0; offset < message_len || (whole && offset == 0);) {
    const bool first = offset == 0;
    proto::FrameHeader h;
    h.type = proto::FrameType::kPublish;
    h.subject_len = static_cast<std::uint16_t>(first ? m.subject.size() : 0);
    h.reply_len = static_cast<std::uint16_t>(first ? m.reply.size() : 0);
    h.header_len = static_cast<std::uint16_t>(first ? block.size() : 0);
    std::size_t chunk = message_len;
    if (!whole) {
      // Every fragment but the last carries a multiple of 8 bytes.
      const std::size_t space = max_frame - proto::kHeaderSize - (first ? strings : 0);
      chunk = std::min(message_len - offset, space & ~(proto::kFrameAlign - 1));
      h.flags = proto::kFlagFragment;
      h.arg = static_cast<std::uint32_t>(message_len);
      h.offset = static_cast<std::uint32_t>(offset);
      h.sequence = r.publisher_id;
    }
    h.payload_len = static_cast<std::uint32_t>(chunk);
    const auto len = static_cast<std::uint32_t>(h.frame_len());
    std::byte* p = room(r, len, m.subject);
    if (p == nullptr) {
      // Recipients that have fragments of it get ABORT (SPEC.md §3.7).
      if (!first) {
        for (const Subscriber& s : to)
          r.batches[s.worker].push_back({s.connection, s.slot, make_abort(s.sid, r.publisher_id)});
      }
      return;
    }
    write_publish(p, h, m, block, offset, chunk, len);
    const std::uint32_t frame_at = r.used;
    r.used += len;
    deliver_frame(r, to, frame_at, len, h.payload_len);
    offset += chunk;
    if (whole) break;
    // A fragment goes at once: the workers forward it while the next is made.
    hand_over(r);
  }
}

void Routes::deliver_frame(Route& r, const std::vector<Subscriber>& to, std::uint32_t frame_at,
                           std::uint32_t len, std::uint32_t payload_len) {
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  for (const Subscriber& s : to) {
    if (s.worker == kChannelWorker) {
      // Its engine sequences it and sends it to the group (Router::route_to).
      core_.slots->add_queued(s.slot, 1);
      r.channel_batch.push_back(
          {static_cast<std::uint32_t>(s.connection), r.buffer.clone(), frame_at, len, payload_len, now});
      continue;
    }
    core_.slots->add_queued(s.slot, len);
    // A subscriber's consecutive messages in this buffer go as one DELIVER
    // run, as a publisher's frames of one SEND do (Router::route_to).
    auto& batch = r.batches[s.worker];
    if (batch.empty() || batch.back().connection != s.connection ||
        !extend_delivery(batch.back().item, r.buffer, s.sid, frame_at, len, payload_len,
                         core_.options.buffer_size)) {
      batch.push_back(
          {s.connection, s.slot, make_delivery(r.buffer.clone(), s.sid, frame_at, len, payload_len, now)});
    }
  }
}

}  // namespace rdmabroker::daemon
