// SPDX-License-Identifier: Apache-2.0
#include "multicast/engine.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>

#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/proto/subjects.hpp"
#include "worker/worker.hpp"
#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker::daemon {

namespace {

/// How often a channel with joined members announces its last sequence
/// number, so that a client notices a lost tail without a later message.
constexpr auto kHeartbeat = std::chrono::milliseconds(50);

}  // namespace

// ---------------------------------------------------------------- setup

MulticastEngine::MulticastEngine(BrokerCore& core, const DeviceSet& devices, WorkerDispatch& workers)
    : core_(core), devices_(devices), workers_(workers), settings_(core.options.multicast) {}

Result<std::unique_ptr<MulticastEngine>> MulticastEngine::create(BrokerCore& core, const DeviceSet& devices,
                                                                 WorkerDispatch& workers) {
  std::unique_ptr<MulticastEngine> e(new MulticastEngine(core, devices, workers));
  const std::string& range = e->settings_.groups;  // validated by the config loader
  const auto slash = range.find('/');
  in_addr base{};
  unsigned bits = 32;
  if (slash == std::string::npos || inet_pton(AF_INET, range.substr(0, slash).c_str(), &base) != 1) {
    return Error{ErrorKind::kInvalidArgument, "multicast.groups: not an IPv4 range: " + range};
  }
  std::from_chars(range.data() + slash + 1, range.data() + range.size(), bits);
  e->group_count_ = bits >= 32 ? 1 : (1u << (32 - bits)) - 1;  // the range's first address is not used
  e->group_base_ = (ntohl(base.s_addr) & ~((bits >= 32 ? 0u : (1u << (32 - bits))) - 1)) + 1;
  std::random_device random;
  e->last_channel_ = random();
  e->next_group_ = random() % e->group_count_;
  e->cm_channel_.reset(rdma_create_event_channel());
  if (!e->cm_channel_)
    return Error{ErrorKind::kResource, std::string("rdma_create_event_channel: ") + std::strerror(errno)};
  const int flags = fcntl(e->cm_channel_->fd, F_GETFL);
  fcntl(e->cm_channel_->fd, F_SETFL, flags | O_NONBLOCK);
  e->epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!e->epoll_ || !e->commands_.valid() || !e->publishes_.valid()) {
    return Error{ErrorKind::kResource, "multicast engine: epoll/eventfd"};
  }
  for (int fd : {e->commands_.fd(), e->publishes_.fd(), e->cm_channel_->fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(e->epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  e->remote_.resize(core.options.workers);
  // A window entry pins a pool buffer: all windows together may pin a quarter of the pool.
  e->window_limit_ = std::max<std::size_t>(core.options.pool_buffers / 4, 16);
  core.multicast_backlog = std::max<std::uint64_t>(
      std::min<std::uint64_t>(e->settings_.retransmit_window, e->window_limit_) / 4, 4);
  return e;
}

MulticastEngine::~MulticastEngine() { stop(); }

void MulticastEngine::start() {
  started_ = true;
  thread_ = std::thread([this] {
    name_this_thread("rb-multicast");
    run();
  });
}

void MulticastEngine::stop() {
  if (!started_.exchange(false)) return;
  commands_.post(Stop{});
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------- worker side

std::uint32_t MulticastEngine::subscribe(std::string_view subject, const ChannelMember& member,
                                         std::uint32_t interest) {
  std::lock_guard lock(registry_mutex_);
  auto it = by_subject_.find(std::string(subject));
  if (it == by_subject_.end()) {
    Registered r;
    do {
      ++last_channel_;
    } while (last_channel_ == 0 || subject_of_.contains(last_channel_));
    r.id = last_channel_;
    // The channel stands in the index for all its members: one route per publish.
    Subscriber channel{kChannelWorker, r.id, 0, core_.multicast_slot, 0};
    channel.interest = interest;
    r.entry = core_.index.add(subject, channel);
    it = by_subject_.emplace(std::string(subject), r).first;
    subject_of_[r.id] = std::string(subject);
  }
  ++it->second.members;
  // Posted under the lock: the engine sees adds and removes in registry order.
  commands_.post(AddMember{it->second.id, std::string(subject), member});
  return it->second.id;
}

void MulticastEngine::unsubscribe(std::uint32_t channel, std::uint64_t connection, std::uint32_t sid) {
  std::lock_guard lock(registry_mutex_);
  auto s = subject_of_.find(channel);
  if (s == subject_of_.end()) return;
  auto it = by_subject_.find(s->second);
  if (--it->second.members == 0) {
    core_.index.remove(it->first, it->second.entry);
    by_subject_.erase(it);
    subject_of_.erase(s);
  }
  commands_.post(RemoveMember{channel, connection, sid});
}

void MulticastEngine::publish(std::vector<ChannelPublish>&& batch) {
  publishes_.post(PublishBatch{std::move(batch)});
}

void MulticastEngine::joined(std::uint64_t connection, std::uint32_t sid, std::uint64_t epoch,
                             std::string error) {
  commands_.post(Joined{connection, sid, epoch, std::move(error)});
}

void MulticastEngine::repair(std::uint64_t connection, std::uint32_t sid, std::uint64_t first,
                             std::uint64_t count) {
  commands_.post(Repair{connection, sid, first, count});
}

void MulticastEngine::reload(const config::MulticastSettings& settings) { commands_.post(Reload{settings}); }

// ---------------------------------------------------------------- engine thread

void MulticastEngine::run() {
  auto next_heartbeat = std::chrono::steady_clock::now() + kHeartbeat;
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_heartbeat - now).count();
    epoll_event evs[3];
    epoll_wait(epoll_.get(), evs, 3, static_cast<int>(std::max<std::int64_t>(wait, 0)));
    handle_cm_events();
    handle_commands();
    publishes_.drain(batches_);
    const auto turn_start = std::chrono::steady_clock::now();
    std::size_t messages = 0;
    for (auto& b : batches_) {
      messages += b.items.size();
      handle(b);
      post_to_workers();  // what one batch produced leaves at once, not at the end of the turn
      if (commands_.pending()) handle_commands();
      if (stopping_) break;
    }
    batches_.clear();
    const auto took = std::chrono::steady_clock::now() - turn_start;
    if (took > std::chrono::seconds(1)) {
      // The devices cannot send as fast as publishers publish: they are slowed
      // (the engine's backlog bound); members see gaps and repair meanwhile.
      spdlog::warn("multicast: {} messages took {} ms to send", messages,
                   std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    }
    for (auto& [d, ep] : endpoints_) poll_sends(*ep);
    if (std::chrono::steady_clock::now() >= next_heartbeat) {
      heartbeats();
      next_heartbeat = std::chrono::steady_clock::now() + kHeartbeat;
    }
  }
  for (auto& [id, ch] : channels_) leave_group(ch);
  channels_.clear();
  post_to_workers();
}

void MulticastEngine::handle_commands() {
  commands_.drain(scratch_);
  for (auto& cmd : scratch_) std::visit([this](auto& c) { handle(c); }, cmd);
  scratch_.clear();
  post_to_workers();
}

MulticastEngine::Channel* MulticastEngine::find_channel(std::uint32_t id) {
  auto it = channels_.find(id);
  return it == channels_.end() ? nullptr : &it->second;
}

MulticastEngine::Member* MulticastEngine::find_member(std::uint64_t connection, std::uint32_t sid,
                                                      Channel** channel) {
  // A connection has few subscriptions and the engine few channels: a scan
  // costs less than keeping a second index consistent.
  for (auto& [id, ch] : channels_) {
    for (auto& m : ch.members) {
      if (m.info.connection == connection && m.info.sid == sid) {
        *channel = &ch;
        return &m;
      }
    }
  }
  return nullptr;
}

void MulticastEngine::handle(AddMember& c) {
  auto [it, created] = channels_.try_emplace(c.channel);
  Channel& ch = it->second;
  if (created) {
    ch.id = c.channel;
    ch.subject = c.subject;
    stats_.channels.add(1);
    spdlog::info("multicast: subject {} is served by channel {}", ch.subject, ch.id);
  }
  ch.members.push_back(Member{c.member});
  stats_.members.add(1);
  update(ch);
}

void MulticastEngine::handle(RemoveMember& c) {
  Channel* ch = find_channel(c.channel);
  if (ch == nullptr) return;
  auto it = std::find_if(ch->members.begin(), ch->members.end(), [&](const Member& m) {
    return m.info.connection == c.connection && m.info.sid == c.sid;
  });
  if (it == ch->members.end()) return;
  if (it->mode == MemberMode::kJoined) stats_.members_joined.add(-1);
  ch->members.erase(it);
  stats_.members.add(-1);
  if (ch->members.empty()) {
    leave_group(*ch);
    window_entries_ -= ch->window.size();
    spdlog::info("multicast: channel {} ({}) closed with its last subscriber", ch->id, ch->subject);
    channels_.erase(c.channel);
    stats_.channels.add(-1);
    return;
  }
  update(*ch);
}

void MulticastEngine::handle(Reload& c) {
  // Only the live settings (subjects, threshold, leave_below) can have changed.
  settings_.subjects = c.settings.subjects;
  settings_.threshold = c.settings.threshold;
  settings_.leave_below = c.settings.leave_below;
  for (auto& [id, ch] : channels_) update(ch);
}

void MulticastEngine::handle(Joined& c) {
  Channel* ch = nullptr;
  Member* m = find_member(c.connection, c.sid, &ch);
  if (m == nullptr || m->mode != MemberMode::kJoining || m->join_epoch != c.epoch)
    return;  // stale: a later (un)join overtook it
  if (c.error.empty()) {
    m->mode = MemberMode::kJoined;
    stats_.members_joined.add(1);
    spdlog::debug("multicast: connection {} subscription {} receives {} from the group from sequence {}",
                  c.connection, c.sid, ch->subject, c.epoch);
    return;
  }
  m->mode = MemberMode::kFallback;
  stats_.client_join_failures.add();
  spdlog::warn(
      "multicast: connection {} could not join the group of {} for subscription {}: {}; it gets unicast "
      "delivery",
      c.connection, ch->subject, c.sid, c.error);
  update(*ch);  // one fewer member that can join: maybe below leave_below
}

void MulticastEngine::handle(Repair& c) {
  Channel* ch = nullptr;
  Member* m = find_member(c.connection, c.sid, &ch);
  if (m == nullptr || c.count == 0 || c.first >= ch->next_sequence) return;
  const std::uint64_t end =
      std::min({c.first + std::min(c.count, proto::kMaxRepairCount), ch->next_sequence});
  stats_.repairs_requested.add(end - c.first);
  spdlog::debug("multicast: connection {} subscription {} asks for {}..{} of {} (window {}..{})",
                c.connection, c.sid, c.first, end - 1, ch->subject,
                ch->window.empty() ? 0 : ch->window.front().sequence, ch->next_sequence - 1);
  const std::uint64_t oldest = ch->window.empty() ? ch->next_sequence : ch->window.front().sequence;
  std::uint64_t from = c.first;
  if (from < oldest) {
    // Beyond the window: said so, first, so the client moves past them before the resent ones arrive.
    const std::uint64_t lost = std::min(end, oldest) - from;
    // Counted once per message, however often the client asks (its retry can cross the answer).
    if (from + lost > m->lost_until) stats_.losses.add(from + lost - std::max(from, m->lost_until));
    m->lost_until = std::max(m->lost_until, from + lost);
    spdlog::warn(
        "multicast: connection {} subscription {} ({}): messages {}..{} are beyond the retransmit window, "
        "reported lost",
        c.connection, c.sid, ch->subject, from, from + lost - 1);
    auto bytes = proto::encode_count(lost);
    OutItem loss = make_control(proto::FrameType::kMcastLoss, c.sid,
                                std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    loss.header.sequence = from;
    loss.fixed_sequence = true;
    to_member(*m, std::move(loss));
    from += lost;
  }
  for (std::uint64_t s = from; s < end; ++s) {
    unicast(*m, ch->window[s - oldest], true);
    stats_.repairs_served.add();
  }
}

void MulticastEngine::handle(PublishBatch& c) {
  std::size_t handled = 0;
  for (auto& p : c.items) {
    core_.slots->add_queued(core_.multicast_slot, -1);  // out of the backlog
    Channel* ch = find_channel(p.channel);
    if (ch == nullptr) {
      // Its last subscriber left while the message was on its way: as for a
      // direct subscriber that closed, the message had nobody left to go to.
      stats_.no_channel.add();
      continue;
    }
    WindowEntry e{ch->next_sequence++, std::move(p.buf), p.frame, p.received_at};
    stats_.messages.add();
    bool dropped = false;
    if constexpr (fault::kEnabled) dropped = ch->grouped && fault::Shared::take(core_.faults.mcast_drops);
    if (ch->grouped && !dropped) pack(*ch, e);
    for (const Member& m : ch->members) {
      if (m.mode != MemberMode::kJoined) unicast(m, e, false);
    }
    remember(*ch, std::move(e));
    // A large batch on a slow device: repair requests and joins need not wait for all of it.
    if (++handled % 64 == 0 && commands_.pending()) {
      for (auto& [id, c] : channels_) flush_packed(c);
      post_to_workers();
      handle_commands();
    }
  }
  // The batch's last datagrams leave now: packing never waits for more.
  for (auto& [id, ch] : channels_) flush_packed(ch);
}

std::uint32_t MulticastEngine::datagram_room(const Channel& ch) const {
  std::uint32_t room = 0;
  for (const auto& [device, dg] : ch.devices) {
    auto ep = endpoints_.find(device);
    if (!dg.joined || ep == endpoints_.end() || ep->second->broken) continue;
    const auto r = static_cast<std::uint32_t>(proto::datagram_chunk(ep->second->mtu));
    room = room == 0 ? r : std::min(room, r);
  }
  return room;
}

void MulticastEngine::pack(Channel& ch, const WindowEntry& e) {
  const std::uint32_t room = datagram_room(ch);
  if (room == 0) return;  // no device joined yet: its members get it over RC
  const bool follows = ch.packed.empty() || ch.packed.back().sequence + 1 == e.sequence;
  if (!follows || ch.packed_bytes + e.frame.len > room) flush_packed(ch);
  if (e.frame.len > room) {  // alone, in fragments
    send_datagrams(ch, std::span(&e, 1));
    return;
  }
  ch.packed.push_back(WindowEntry{e.sequence, e.buf.clone(), e.frame, e.received_at});
  ch.packed_bytes += e.frame.len;
}

void MulticastEngine::flush_packed(Channel& ch) {
  if (ch.packed.empty()) return;
  // Taken out first: a failed send leaves the group, which flushes again.
  std::vector<WindowEntry> out;
  out.swap(ch.packed);
  ch.packed_bytes = 0;
  if (ch.grouped) send_datagrams(ch, out);
}

// ---------------------------------------------------------------- members over RC

void MulticastEngine::to_member(const Member& m, OutItem item) {
  remote_[m.info.worker].push_back({m.info.connection, m.info.slot, std::move(item)});
}

void MulticastEngine::unicast(const Member& m, const WindowEntry& e, bool repair) {
  // Members that can join get sequenced DELIVERs (one stream with the group's
  // datagrams); the others plain ones, as from a direct subscription.
  const std::uint64_t seq = m.info.can_join ? e.sequence : 0;
  core_.slots->add_queued(m.info.slot, e.frame.len);
  if (!repair) stats_.unicast_copies.add();
  auto& batch = remote_[m.info.worker];
  if (!batch.empty() && batch.back().connection == m.info.connection &&
      extend_delivery(batch.back().item, e.buf, m.info.sid, e.frame, core_.options.buffer_size, seq)) {
    return;
  }
  // From its arrival (SPEC.md §3.4): a repair's relay time includes its time in the window.
  const std::int64_t at = e.received_at;
  batch.push_back({m.info.connection, m.info.slot,
                   seq != 0 ? make_sequenced_delivery(e.buf.clone(), m.info.sid, seq, e.frame, at)
                            : make_delivery(e.buf.clone(), m.info.sid, e.frame, at)});
}

void MulticastEngine::post_to_workers() { workers_.post_deliveries(remote_, WorkerDispatch::Handoff::kLend); }

void MulticastEngine::remember(Channel& ch, WindowEntry entry) {
  ch.window.push_back(std::move(entry));
  ++window_entries_;
  const std::size_t own_limit = std::min<std::size_t>(settings_.retransmit_window, window_limit_);
  while (!ch.window.empty() && (ch.window.size() > own_limit || window_entries_ > window_limit_)) {
    ch.window.pop_front();
    --window_entries_;
  }
}

}  // namespace rdmabroker::daemon
