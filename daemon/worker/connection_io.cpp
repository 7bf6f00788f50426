// Worker data path: receive -> decode -> route -> subscriber queues -> one
// flush per touched connection; send completions; and the single teardown path
// every connection takes however it ends.
#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <sys/socket.h>

#include "rdmabroker/proto/multicast.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

using proto::ErrorCode;
using proto::FrameType;

// ---------------------------------------------------------------- receive

void Worker::on_receive(DevicePort& port, const ibv_wc& wc) {
  const auto index = static_cast<std::uint32_t>(wc.wr_id & ~kRecvFlag);
  BufferRef buf(core_.pool, index);  // adopts the reference the SRQ held
  port.posted_flag[index] = 0;
  --port.posted;
  stats_.srq_posted.add(-1);
  stats_.receives.add();

  auto it = port.by_qp.find(wc.qp_num);
  if (it == port.by_qp.end()) {
    stats_.orphan_receives.add();
    return;
  }
  Connection& c = *it->second;
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      stats_.wc_errors.add();
      spdlog::warn("connection {} ({}): receive failed: {}", c.id, c.peer, ibv_wc_status_str(wc.status));
    }
    close(c, CloseReason::kWorkCompletionError);
    return;
  }
  if (!c.credits.on_receive()) {
    close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation, "SEND without a credit");
    return;
  }
  --port.outstanding;
  if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) c.credits.add_send_credits(ntohl(wc.imm_data));
  // The client may send as soon as it sees ESTABLISHED; its data can reach our
  // CQ before our own ESTABLISHED event reaches the CM channel.
  establish(c);
  touch(c);
  if (c.state == ConnState::kEstablished) process_frames(c, buf, 0, wc.byte_len);
}

void Worker::process_frames(Connection& c, const BufferRef& buf, std::uint32_t begin, std::uint32_t end) {
  std::span<const std::byte> data(buf.data(), end);
  std::size_t off = begin;
  while (off < end && c.state == ConnState::kEstablished) {
    proto::Frame f;
    const auto st = proto::decode_frame(data.subspan(off), opt_.buffer_size, f);
    if (st != proto::DecodeStatus::kOk) {
      if (st == proto::DecodeStatus::kTooLarge) stats_.limit_payload.add();
      close(c, CloseReason::kProtocolError, proto::error_for(st),
            "frame at byte " + std::to_string(off - begin) + " of " + std::to_string(end - begin) +
                " received bytes: " + std::string(proto::to_string(st)));
      return;
    }
    f.offset = off;
    const auto& h = f.header;
    if (c.auth != AuthPhase::kDone) {
      if (!before_authentication(c, f)) return;
      off += h.frame_len();
      continue;
    }
    switch (h.type) {
      case FrameType::kPublish:
        if (h.frame_len() > proto::max_publish_frame(opt_.buffer_size)) {
          stats_.limit_payload.add();
          close(c, CloseReason::kProtocolError, ErrorCode::kPayloadTooLarge,
                "PUBLISH of " + std::to_string(h.frame_len()) + " bytes exceeds the limit of " +
                    std::to_string(proto::max_publish_frame(opt_.buffer_size)));
          return;
        }
        if (opt_.max_payload != 0 && h.payload_len > opt_.max_payload) {
          stats_.limit_payload.add();
          close(c, CloseReason::kProtocolError, ErrorCode::kPayloadTooLarge,
                "payload of " + std::to_string(h.payload_len) + " bytes exceeds limits.max_payload (" +
                    std::to_string(opt_.max_payload) + ")");
          return;
        }
        if (!may_publish(c, f.subject)) {
          deny(c, "publish", f.subject, 0);  // refused, not accepted: nothing was lost
          break;
        }
        stats_.messages_in.add();
        stats_.bytes_in.add(h.payload_len);
        ++c.messages_in;
        c.bytes_in += h.payload_len;
        route_publish(c, f, buf);
        break;
      case FrameType::kSubscribe: {
        if (c.subscriptions.contains(h.arg)) {
          enqueue(c, make_control(FrameType::kError,
                                  static_cast<std::uint32_t>(ErrorCode::kDuplicateSubscription),
                                  "subscription id " + std::to_string(h.arg) + " is already in use"));
          break;
        }
        if (c.subscriptions.size() >= opt_.max_subscriptions) {
          stats_.limit_subscriptions.add();
          // Logged once per connection: a client looping over subscribe must not flood the log.
          if (!std::exchange(c.subscription_limit_logged, true)) {
            spdlog::warn(
                "connection {} from {}: limit of {} subscriptions reached (limits.max_subscriptions)", c.id,
                c.peer, opt_.max_subscriptions);
          }
          enqueue(
              c, make_control(FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kTooManySubscriptions),
                              "limit of " + std::to_string(opt_.max_subscriptions) + " subscriptions reached",
                              h.arg));
          break;
        }
        if (!c.identity->may_subscribe(f.subject)) {
          deny(c, "subscribe", f.subject, h.arg);
          break;
        }
        const std::uint64_t cost = SubscriptionBudget::cost(f.subject, f.reply);
        if (auto refusal = core_.subscription_budget.take(cost, opt_.max_subscriptions_total,
                                                          opt_.max_subscription_memory);
            refusal != SubscriptionBudget::Refusal::kNone) {
          refuse_subscription_broker_wide(c, h.arg, refusal);
          break;
        }
        add_subscription(c, f, cost);
        break;
      }
      case FrameType::kUnsubscribe: {
        auto it = c.subscriptions.find(h.arg);
        if (it == c.subscriptions.end()) {
          enqueue(c,
                  make_control(FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kUnknownSubscription),
                               "no subscription with id " + std::to_string(h.arg)));
          break;
        }
        drop_subscription(c, it->second, it->first);
        c.subscriptions.erase(it);
        break;
      }
      case FrameType::kMcastJoined:
      case FrameType::kMcastRepair:
        if (!on_multicast_frame(c, f)) return;
        break;
      case FrameType::kPing:
        enqueue(c, make_control(FrameType::kPong, 0));
        break;
      case FrameType::kCredit:
        // Over TCP the socket's own window is the flow control; CREDIT is ignored.
        if (c.transport == Transport::kRdma) c.credits.add_send_credits(h.arg);
        break;
      case FrameType::kClose:
        c.close_received = true;
        close(c, CloseReason::kClientClose);
        return;
      case FrameType::kConnect:
        close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation, "CONNECT sent twice");
        return;
      case FrameType::kDeliver:
      case FrameType::kPong:
      case FrameType::kError:
      case FrameType::kNoResponders:
      case FrameType::kMcastJoin:
      case FrameType::kMcastLoss:
      case FrameType::kMcastLeave:
        close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
              std::string(proto::to_string(h.type)) + " is sent by the broker, never to it");
        return;
    }
    off += h.frame_len();
  }
}

// Called only for frames process_frames() has size-checked (max_publish_frame),
// so every DELIVER built here fits a subscriber's buffer.
void Worker::route_publish(Connection& publisher, const proto::Frame& f, const BufferRef& buf) {
  Match& match = match_cache_.match(core_.index, f.subject);
  if (match.empty()) {
    stats_.messages_no_subscribers.add();
    if ((f.header.flags & proto::kFlagRequest) != 0) {
      // A request nobody can answer: tell the requester at once instead of
      // letting it wait for its timeout (SPEC.md §3.3, NO_RESPONDERS).
      stats_.no_responders.add();
      enqueue(publisher, make_no_responders(f.reply));
    }
    return;
  }
  stats_.routed.add(match.fanout());
  // Stall watermark: three quarters of the bound leaves room for what the
  // publishers already have in flight when they are slowed down.
  auto watermark = [&](std::uint32_t slot) {
    const std::uint64_t bound = core_.backlog_bound(slot, opt_.max_pending_bytes);
    return static_cast<std::int64_t>(bound - bound / 4);
  };
  const Subscriber* backlogged = nullptr;
  auto deliver = [&](const Subscriber& s) {
    if (!route_to(s, f, buf)) return;
    if (backlogged == nullptr && core_.slots->queued(s.slot) > watermark(s.slot)) backlogged = &s;
  };
  for (const Subscriber& s : match.plain) deliver(s);
  for (std::size_t g = 0; g < match.groups.size(); ++g) {
    // One member per message, round robin (docs/subjects.md); a member that
    // this worker already knows to be closing is passed over.
    const Subscriber* chosen = &match.pick(g);
    for (std::size_t tries = 1; tries < match.groups[g].size() && !is_live(*chosen); ++tries)
      chosen = &match.pick(g);
    deliver(*chosen);
  }
  if (backlogged != nullptr && !publisher.stalled) {
    // Slow this publisher down (its credits are withheld) rather than let a
    // subscriber that is merely behind overflow its queue. Bounded in time: a
    // subscriber that stopped reading overflows its bound or misses its write
    // deadline and is cut off.
    stats_.producer_stalls.add();
    publisher.stalled = true;
    publisher.stall_slot = backlogged->slot;
    publisher.stall_queued = core_.slots->queued(backlogged->slot);
    publisher.stalled_until = now_ + std::chrono::milliseconds(opt_.producer_stall_ms);
    stalled_.push_back(publisher.id);
    pause_reading(publisher);
  }
}

bool Worker::is_live(const Subscriber& s) {
  if (s.worker != index_) return true;  // another worker's: it decides
  const Connection* c = find(s.connection);
  return c != nullptr && c->state == ConnState::kEstablished;
}

bool Worker::route_to(const Subscriber& s, const proto::Frame& f, const BufferRef& buf) {
  const auto off = static_cast<std::uint32_t>(f.offset);
  const auto len = static_cast<std::uint32_t>(f.header.frame_len());
  if (s.worker == kChannelWorker) {
    // A multicast channel: its engine sequences the message and fans it out.
    core_.slots->add_queued(s.slot, 1);  // the engine's backlog (in messages), until it has handled it
    channel_batch_.push_back({static_cast<std::uint32_t>(s.connection), buf.clone(), off, len,
                              f.header.payload_len, now_.time_since_epoch().count()});
    return true;
  }
  if (s.worker == index_) {
    Connection* c = find(s.connection);
    if (c == nullptr || c->state != ConnState::kEstablished) {
      stats_.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add();
      return false;
    }
    core_.slots->add_queued(s.slot, len);
    deliver_local(*c, buf, s.sid, f);
    return true;
  }
  core_.slots->add_queued(s.slot, len);
  auto& batch = remote_[s.worker];
  if (batch.empty() || batch.back().connection != s.connection ||
      !extend_delivery(batch.back().item, buf, s.sid, off, len, f.header.payload_len, opt_.buffer_size)) {
    batch.push_back(
        {s.connection, s.slot,
         make_delivery(buf.clone(), s.sid, off, len, f.header.payload_len, now_.time_since_epoch().count())});
  }
  return true;
}

void Worker::deliver_local(Connection& c, const BufferRef& buf, std::uint32_t sid, const proto::Frame& f) {
  const auto off = static_cast<std::uint32_t>(f.offset);
  const auto len = static_cast<std::uint32_t>(f.header.frame_len());
  if (may_queue(c, len) && !c.outq.empty() &&
      extend_delivery(c.outq.back(), buf, sid, off, len, f.header.payload_len, opt_.buffer_size)) {
    ++c.pending_messages;
    c.pending_bytes += len;
    stats_.pending_messages.add(1);
    stats_.pending_bytes.add(len);
    touch(c);
    return;
  }
  enqueue(c,
          make_delivery(buf.clone(), sid, off, len, f.header.payload_len, now_.time_since_epoch().count()));
}

void BrokerCore::post_deliveries(std::vector<std::vector<RemoteDelivery>>& per_worker) const {
  for (std::size_t w = 0; w < per_worker.size(); ++w) {
    if (per_worker[w].empty()) continue;
    DeliverCommand cmd;
    cmd.items.swap(per_worker[w]);
    workers[w]->post(std::move(cmd));
  }
}

void Worker::post_remote_batches() {
  core_.post_deliveries(remote_);
  // After the workers' batches: a subject that just moved to a channel must
  // not have its next message overtake, through the engine, the last one
  // this worker routed to a subscriber directly.
  if (!channel_batch_.empty()) core_.multicast->publish(std::exchange(channel_batch_, {}));
}

std::int64_t BrokerCore::pending_charge_total() const {
  std::int64_t total = 0;
  for (const Worker* w : workers) {
    total += queued_charge(w->stats().pending_bytes.get(), w->stats().pending_messages.get());
  }
  return total;
}

std::uint64_t Worker::fair_pending_share() const {
  return opt_.max_pending_bytes_total / std::max<std::uint32_t>(opt_.max_connections, 1);
}

bool Worker::may_queue(const Connection& c, std::uint64_t len, std::uint32_t messages) const {
  if (c.pending_bytes + len > opt_.max_pending_bytes) return false;
  // The broker-wide bound charges each queued message its bookkeeping too
  // (payloads sit in the registered pool; the heap holds one OutItem per
  // message at most). Within its share of that bound a subscriber never
  // needs the total (no cross-worker reads on the common path); above it,
  // only while the broker's queues together stay within the bound.
  const std::int64_t charge = queued_charge(static_cast<std::int64_t>(len), messages);
  const std::int64_t held = queued_charge(static_cast<std::int64_t>(c.pending_bytes),
                                          static_cast<std::int64_t>(c.pending_messages));
  if (held + charge <= static_cast<std::int64_t>(fair_pending_share())) return true;
  return core_.pending_charge_total() + charge <= static_cast<std::int64_t>(opt_.max_pending_bytes_total);
}

void Worker::enqueue(Connection& c, OutItem item) {
  if (item.is_delivery() && !may_queue(c, item.body_len, item.messages)) {
    const bool own = c.pending_bytes + item.body_len > opt_.max_pending_bytes;
    const std::string why = own ? std::to_string(c.pending_bytes) + " bytes pending, limit " +
                                      std::to_string(opt_.max_pending_bytes)
                                : std::to_string(c.pending_bytes) +
                                      " bytes pending while the broker's queues hold more than "
                                      "limits.max_pending_bytes_total (" +
                                      std::to_string(opt_.max_pending_bytes_total) +
                                      "), above this subscriber's share of it (" +
                                      std::to_string(fair_pending_share()) + ")";
    spdlog::warn("connection {} ({}): slow consumer, {} messages: {}", c.id, c.peer, c.pending_messages, why);
    if (!own) stats_.limit_pending_total.add();
    stats_.dropped[static_cast<std::size_t>(DropReason::kSlowConsumer)].add(item.messages);  // these
    unqueue(c.slot, item.body_len);
    close(c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer, why);
    return;
  }
  if (!item.is_delivery()) {
    if (c.queued_replies >= kMaxQueuedReplies) {
      spdlog::warn("connection {} ({}): slow consumer, {} replies unread", c.id, c.peer, c.queued_replies);
      close(c, CloseReason::kSlowConsumer, ErrorCode::kSlowConsumer,
            std::to_string(c.queued_replies) + " replies unread");
      return;
    }
    ++c.queued_replies;
  }
  if (c.pending_bytes == 0) c.last_progress = now_;  // the write deadline counts from here
  c.pending_messages += item.messages;
  c.pending_bytes += item.body_len;
  stats_.pending_messages.add(item.messages);
  stats_.pending_bytes.add(item.body_len);
  c.outq.push_back(std::move(item));
  touch(c);
}

// ---------------------------------------------------------------- send

void Worker::touch(Connection& c) {
  if (!c.touched) {
    c.touched = true;
    touched_.push_back(&c);
  }
}

void Worker::flush_touched() {
  // flush() may close a connection, but never destroys one: pointers stay valid.
  for (std::size_t i = 0; i < touched_.size(); ++i) {
    Connection* c = touched_[i];
    c->touched = false;
    flush(*c);
  }
  touched_.clear();
}

std::uint32_t Worker::take_credits_to_return(Connection& c) {
  if (c.stalled) return 0;  // a stalled publisher waits for its credits
  // A credit returned claims one posted receive of the port's SRQ.
  const std::uint32_t n = c.credits.take_owed(c.port->credit_budget());
  c.port->outstanding += n;
  return n;
}

void Worker::flush(Connection& c) {
  if (c.state == ConnState::kEstablished || c.state == ConnState::kDraining) {
    if (c.transport == Transport::kRdma) {
      flush_rdma(c);
    } else {
      flush_tcp(c);
    }
  }
  if (c.state == ConnState::kDraining && c.outq.empty() && c.inflight_count == 0) disconnect(c);
}

std::uint32_t Worker::pack_next(Connection& c, std::uint32_t max_sge, std::uint32_t block_lkey,
                                std::uint32_t body_lkey, ibv_sge* sge,
                                std::array<BufferRef, kMaxFramesPerSend>& refs, PackedSend& packed) {
  if (free_blocks_.empty()) return kNoBlock;  // retried when a send completes
  const std::uint32_t block = free_blocks_.back();
  packed = pack_send(c.outq, PackLimits{c.peer_buffer_size, max_sge}, block_span(block), block_lkey,
                     body_lkey, c.next_sequence, sge, refs.data());
  if (packed.frames == 0) {
    // Cannot happen: the handshake guarantees every frame fits a peer buffer.
    spdlog::error("connection {}: a {}-byte frame does not fit one send", c.id, c.outq.front().wire_len());
    close(c, CloseReason::kProtocolError);
    return kNoBlock;
  }
  free_blocks_.pop_back();
  c.queued_replies -= std::min(c.queued_replies, packed.replies);  // close()'s own frame is not counted
  c.pending_messages -= packed.deliveries;
  c.pending_bytes -= packed.delivery_bytes;
  stats_.pending_messages.add(-static_cast<std::int64_t>(packed.deliveries));
  stats_.pending_bytes.add(-static_cast<std::int64_t>(packed.delivery_bytes));
  unqueue(c.slot, packed.delivery_bytes);
  return block;
}

InflightSend& Worker::record_send(Connection& c, std::uint32_t block,
                                  std::array<BufferRef, kMaxFramesPerSend>* refs, const PackedSend& packed) {
  const std::uint32_t slot =
      (c.inflight_head + c.inflight_count) % static_cast<std::uint32_t>(c.inflight.size());
  InflightSend& rec = c.inflight[slot];
  rec.block = block;
  rec.frames = packed.frames;
  rec.deliveries = packed.deliveries;
  rec.delivered_payload = packed.delivered_payload;
  rec.oldest_received_at = packed.oldest_received_at;
  if (refs != nullptr) {
    for (std::uint32_t i = 0; i < packed.frames; ++i) rec.refs[i] = std::move((*refs)[i]);
  }
  return rec;
}

void Worker::flush_rdma(Connection& c) {
  DevicePort& port = *c.port;
  staged_.clear();
  while (c.inflight_count < c.inflight.size() - 1) {
    const bool has_data = !c.outq.empty();
    if (!has_data || !c.credits.can_send_data()) {
      if (has_data) stats_.credit_stalls.add();
      // Nothing to carry credits, or no credit for data: owed credits go
      // back alone if the client needs them, on the reserved last credit if
      // need be (SPEC.md §5: without this both sides can wait forever).
      if (c.credits.should_return() && c.credits.can_send_credit_update() && port.credit_budget() > 0) {
        const std::uint32_t imm = take_credits_to_return(c);
        if (imm > 0) {
          stage_send(c, kNoBlock, nullptr, 0, imm, nullptr, PackedSend{});
          stats_.credit_updates.add();
        }
      }
      break;
    }
    ibv_sge sge[kMaxSendSge];
    std::array<BufferRef, kMaxFramesPerSend> refs;
    PackedSend packed;
    const std::uint32_t block =
        pack_next(c, port.max_sge, port.send_blocks_mr->lkey, port.device->pool_mr->lkey, sge, refs, packed);
    if (block == kNoBlock) break;
    stage_send(c, block, sge, packed.num_sge, take_credits_to_return(c), &refs, packed);
  }
  post_staged(c);
}

void Worker::stage_send(Connection& c, std::uint32_t block, const ibv_sge* sge, std::uint32_t num_sge,
                        std::uint32_t imm, std::array<BufferRef, kMaxFramesPerSend>* refs,
                        const PackedSend& packed) {
  const std::uint32_t slot =
      (c.inflight_head + c.inflight_count) % static_cast<std::uint32_t>(c.inflight.size());
  record_send(c, block, refs, packed);
  StagedSend& st = staged_.emplace_back();
  std::copy_n(sge, num_sge, st.sge.begin());
  st.wr = ibv_send_wr{};
  st.wr.wr_id = slot;
  st.wr.opcode = IBV_WR_SEND_WITH_IMM;
  st.wr.imm_data = htonl(imm);
  st.wr.sg_list = st.sge.data();
  st.wr.num_sge = static_cast<int>(num_sge);
  // Small sends (a lone message at light load, control frames) go inline:
  // the device copies them at post time instead of reading them by DMA
  // afterwards, one round trip over the bus less. The buffers stay
  // referenced until the completion all the same (one rule for every send).
  std::uint32_t bytes = 0;
  for (std::uint32_t i = 0; i < num_sge; ++i) bytes += sge[i].length;
  if (bytes > 0 && bytes <= c.max_inline) st.wr.send_flags = IBV_SEND_INLINE;
  st.frames = packed.frames;
  ++c.inflight_count;
  c.credits.consume_send();
}

void Worker::post_staged(Connection& c) {
  if (staged_.empty()) return;
  // One ibv_post_send for the whole chain (on Soft-RoCE each post is a system
  // call) and one completion for it: only the last WR is signaled, and its
  // completion retires every send before it (an RC send queue completes in
  // order), so a batch of N sends costs one CQE instead of N.
  for (std::size_t i = 0; i + 1 < staged_.size(); ++i) staged_[i].wr.next = &staged_[i + 1].wr;
  staged_.back().wr.send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(c.qp.get(), &staged_.front().wr, &bad);
  std::size_t posted = staged_.size();
  if (rc != 0) {
    const int err = errno;
    posted = 0;  // bad: the first WR not posted
    while (posted < staged_.size() && &staged_[posted].wr != bad) ++posted;
    // Never posted: undo their records, newest first (they are the ring's tail).
    for (std::size_t i = staged_.size(); i-- > posted;) {
      --c.inflight_count;
      release_send(
          c, c.inflight[(c.inflight_head + c.inflight_count) % static_cast<std::uint32_t>(c.inflight.size())],
          false);
    }
    spdlog::warn("connection {} ({}): ibv_post_send: {}", c.id, c.peer, std::strerror(err));
    stats_.wc_errors.add();
  }
  for (std::size_t i = 0; i < posted; ++i) {
    stats_.sends_posted.add();
    stats_.frames_sent.add(staged_[i].frames);
  }
  staged_.clear();
  if (rc != 0) close(c, CloseReason::kWorkCompletionError);
}

void Worker::retire_send(Connection& c, bool success) {
  release_send(c, c.inflight[c.inflight_head], success);
  c.inflight_head = (c.inflight_head + 1) % static_cast<std::uint32_t>(c.inflight.size());
  --c.inflight_count;
}

void Worker::release_send(Connection& c, InflightSend& rec, bool success) {
  for (std::uint32_t i = 0; i < rec.frames; ++i) rec.refs[i].reset();
  if (rec.block != kNoBlock) free_blocks_.push_back(rec.block);
  if (success) {
    stats_.deliveries.add(rec.deliveries);
    stats_.bytes_out.add(rec.delivered_payload);
    c.messages_out += rec.deliveries;
    c.bytes_out += rec.delivered_payload;
    if (rec.oldest_received_at != 0) {
      const auto age = std::chrono::steady_clock::now().time_since_epoch().count() - rec.oldest_received_at;
      stats_.relay_latency.observe(static_cast<double>(age) * 1e-9);
    }
  } else {
    // Posted but never completed: the subscriber did not get them.
    stats_.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add(rec.deliveries);
  }
  rec = InflightSend{};
}

void Worker::on_send_complete(DevicePort& port, const ibv_wc& wc) {
  auto it = port.by_qp.find(wc.qp_num);
  if (it == port.by_qp.end()) return;  // destroyed after its deadline; refs were released then
  Connection& c = *it->second;
  if (c.inflight_count == 0) return;
  // Only the last send of each posted chain is signaled (post_staged): this
  // completion stands for every send from the ring's head up to its slot.
  const auto size = static_cast<std::uint32_t>(c.inflight.size());
  std::uint32_t covered = (static_cast<std::uint32_t>(wc.wr_id) + size - c.inflight_head) % size + 1;
  covered = std::min(covered, c.inflight_count);
  // A send that failed by itself leaves those before it delivered; a flushed
  // one (the QP went to error) says nothing of unsignaled ones before it, and
  // they are counted as dropped, never as delivered.
  const bool before_ok = wc.status != IBV_WC_WR_FLUSH_ERR;
  for (std::uint32_t i = 1; i < covered; ++i) retire_send(c, before_ok);
  retire_send(c, wc.status == IBV_WC_SUCCESS);
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      stats_.wc_errors.add();
      spdlog::warn("connection {} ({}): send failed: {}", c.id, c.peer, ibv_wc_status_str(wc.status));
    }
    close(c, CloseReason::kWorkCompletionError);
    try_finish(c);
    return;
  }
  if (c.state == ConnState::kDisconnecting) {
    try_finish(c);
    return;
  }
  c.last_progress = now_;
  touch(c);
  wake_block_waiters();
}

void Worker::wake_block_waiters() {
  // The block just freed is the only one: connections that found none wait
  // for it (pack_next() returned kNoBlock with data queued).
  if (free_blocks_.size() != 1) return;
  for (auto& [id, other] : connections_) {
    if (!other->outq.empty()) touch(*other);
  }
}

// ---------------------------------------------------------------- teardown

void Worker::close(Connection& c, CloseReason reason, ErrorCode code, std::string message) {
  if (c.state == ConnState::kDraining || c.state == ConnState::kDisconnecting) {
    if (c.state == ConnState::kDraining && c.peer_disconnected) disconnect(c);
    return;
  }
  c.reason = reason;
  remove_subscriptions(c);
  const bool can_tell =
      c.state == ConnState::kEstablished && !c.peer_disconnected && code != ErrorCode::kNone;
  if (!can_tell) {
    disconnect(c);
    return;
  }
  // Shutdown flushes what is queued, then sends CLOSE; any other reason drops
  // the queue (counted) and sends ERROR, or CLOSE for a slow consumer. Either
  // way the client learns why before the disconnect.
  if (reason == CloseReason::kProtocolError) {
    stats_.protocol_errors.add();
    spdlog::warn("connection {} ({}): protocol error: {}", c.id, c.peer, message);
  }
  if (reason != CloseReason::kBrokerShutdown) drop_queue(c, drop_reason_for(reason));
  const bool is_close = reason == CloseReason::kBrokerShutdown || reason == CloseReason::kSlowConsumer;
  const FrameType type = is_close ? FrameType::kClose : FrameType::kError;
  c.outq.push_back(make_control(type, static_cast<std::uint32_t>(code), std::move(message)));
  c.state = ConnState::kDraining;
  c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.drain_timeout_ms);
  closing_.push_back(c.id);
  touch(c);
}

void Worker::disconnect(Connection& c) {
  if (c.state == ConnState::kDisconnecting) return;
  if (c.reason == CloseReason::kCount) c.reason = CloseReason::kPeerDisconnected;
  remove_subscriptions(c);
  drop_queue(c, drop_reason_for(c.reason));
  c.state = ConnState::kDisconnecting;
  c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.drain_timeout_ms);
  closing_.push_back(c.id);
  if (c.transport == Transport::kRdma) {
    // Moves the QP to the error state: posted sends complete as flushed.
    if (!c.peer_disconnected) rdma_disconnect(c.cm_id.get());
  } else {
    // A send cut short by the deadline will never complete.
    while (c.inflight_count > 0) retire_send(c, false);
    c.tcp.writing = false;
    // FIN after what was written; the socket is read (and discarded) until
    // the peer's FIN, the TCP twin of waiting for DISCONNECTED.
    if (!c.peer_disconnected) ::shutdown(c.tcp.fd.get(), SHUT_WR);
    c.tcp.rbuf.reset();
    if (!c.tcp.reading) resume_reading(c);
    update_tcp_events(c);
  }
  try_finish(c);
}

void Worker::drop_queue(Connection& c, DropReason why) {
  stats_.pending_messages.add(-static_cast<std::int64_t>(c.pending_messages));
  stats_.pending_bytes.add(-static_cast<std::int64_t>(c.pending_bytes));
  stats_.dropped[static_cast<std::size_t>(why)].add(c.pending_messages);
  unqueue(c.slot, c.pending_bytes);
  c.pending_messages = 0;
  c.pending_bytes = 0;
  c.queued_replies = 0;
  c.outq.clear();
}

void Worker::try_finish(Connection& c) {
  if (c.state != ConnState::kDisconnecting || c.reaping) return;
  const bool drained = c.inflight_count == 0 && c.peer_disconnected;
  if (!drained && std::chrono::steady_clock::now() < c.deadline) return;
  // Destroyed at the end of the loop turn, never under a caller that still
  // holds a reference to it.
  c.reaping = true;
  reap_.push_back(c.id);
}

void Worker::reap() {
  for (std::uint64_t id : reap_) {
    if (Connection* c = find(id)) destroy(*c);
  }
  reap_.clear();
}

void Worker::destroy(Connection& c) {
  // Release what in-flight sends still hold (only after a deadline forced us).
  while (c.inflight_count > 0) retire_send(c, false);
  if (c.transport == Transport::kRdma) {
    DevicePort& port = *c.port;
    port.outstanding -= std::min(port.outstanding, c.credits.forfeit());
    port.cq_reserved -= static_cast<std::uint32_t>(c.inflight.size());  // its send window (handle_accept)
    port.by_qp.erase(c.qp_num);
  } else {
    stats_.tcp_connections.add(-1);
  }
  stats_.connections_closed[static_cast<std::size_t>(c.reason)].add();
  stats_.connections_current.add(-1);
  core_.slots->release(c.slot);
  spdlog::info("connection {} ({}, {}) closed: {}", c.id, to_string(c.transport), c.peer,
               to_string(c.reason));
  if (c.touched) {
    std::erase(touched_, &c);
    c.touched = false;
  }
  // QP before cm_id (member order of Connection); erase destroys both, or
  // closes the socket (which also leaves the epoll set).
  c.qp.reset();
  connections_.erase(c.id);
}

void Worker::remove_subscriptions(Connection& c) {
  for (const auto& [sid, sub] : c.subscriptions) drop_subscription(c, sub, sid);
  c.subscriptions.clear();
}

void Worker::refuse_subscription_broker_wide(Connection& c, std::uint32_t sid,
                                             SubscriptionBudget::Refusal refusal) {
  const bool by_count = refusal == SubscriptionBudget::Refusal::kCount;
  (by_count ? stats_.limit_subscriptions_total : stats_.limit_subscription_memory).add();
  const std::string what = by_count ? "broker-wide limit of " + std::to_string(opt_.max_subscriptions_total) +
                                          " subscriptions reached (limits.max_subscriptions_total)"
                                    : "broker-wide subscription memory limit of " +
                                          std::to_string(opt_.max_subscription_memory) +
                                          " bytes reached (limits.max_subscription_memory)";
  // Logged once per connection, like the per-connection limit.
  if (!std::exchange(c.subscription_limit_logged, true))
    spdlog::warn("connection {} from {}: {}", c.id, c.peer, what);
  enqueue(c, make_control(FrameType::kError, static_cast<std::uint32_t>(ErrorCode::kTooManySubscriptions),
                          what, sid));
}

void Worker::add_subscription(Connection& c, const proto::Frame& f, std::uint64_t cost) {
  const std::uint32_t sid = f.header.arg;
  // An exact subscription (no wildcard, no queue group) to a multicast-backed
  // subject is served by the subject's channel (multicast/engine.hpp).
  if (core_.multicast != nullptr && f.reply.empty() && proto::valid_subject(f.subject) &&
      MulticastEngine::eligible(opt_.multicast, f.subject)) {
    ChannelMember m{c.id, index_, c.slot, sid, c.multicast_capable};
    if (c.multicast_capable && c.port != nullptr && c.cm_id) {
      m.device = c.port->device->index;
      const sockaddr* local = rdma_get_local_addr(c.cm_id.get());
      std::memcpy(&m.local, local, local->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    }
    const std::uint32_t channel = core_.multicast->subscribe(f.subject, m);
    c.subscriptions.emplace(sid, Connection::Subscription{std::string(f.subject), {}, channel, cost});
    return;
  }
  // The reply field of a SUBSCRIBE names its queue group (SPEC.md §3.3).
  const Subscriber stored = core_.index.add(f.subject, Subscriber{index_, c.id, sid, c.slot}, f.reply);
  c.subscriptions.emplace(sid, Connection::Subscription{std::string(f.subject), stored, 0, cost});
}

void Worker::drop_subscription(Connection& c, const Connection::Subscription& sub, std::uint32_t sid) {
  core_.subscription_budget.give_back(sub.cost);
  if (sub.channel != 0) {
    core_.multicast->unsubscribe(sub.channel, c.id, sid);
  } else {
    core_.index.remove(sub.pattern, sub.stored);
  }
}

bool Worker::on_multicast_frame(Connection& c, const proto::Frame& f) {
  if (core_.multicast == nullptr || !c.multicast_capable) {
    close(c, CloseReason::kProtocolError, ErrorCode::kProtocolViolation,
          std::string(proto::to_string(f.header.type)) +
              " without multicast (the broker has it off, or the client "
              "did not offer it when connecting)");
    return false;
  }
  const auto it = c.subscriptions.find(f.header.arg);
  if (it == c.subscriptions.end() || it->second.channel == 0) {
    // Crossed with an UNSUBSCRIBE, or a subject moved off multicast by a reload: nothing to do.
    return true;
  }
  if (f.header.type == FrameType::kMcastJoined) {
    core_.multicast->joined(c.id, f.header.arg, f.header.sequence,
                            std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
  } else {
    core_.multicast->repair(c.id, f.header.arg, f.header.sequence, proto::decode_count(f.payload));
  }
  return true;
}

}  // namespace rdmabroker::daemon
