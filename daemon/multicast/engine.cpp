#include "multicast/engine.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "rdmabroker/proto/multicast.hpp"
#include "rdmabroker/proto/subjects.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

namespace {

/// How often a channel with joined members announces its last sequence
/// number, so that a client notices a lost tail without a later message.
constexpr auto kHeartbeat = std::chrono::milliseconds(50);
/// Staging slots (datagrams in flight) per device.
constexpr std::uint32_t kSlots = 512;
/// The biggest MTU verbs knows; a slot holds one datagram.
constexpr std::uint32_t kSlotSize = 4096;

std::uint32_t mtu_bytes(ibv_mtu m) { return 128u << static_cast<unsigned>(m); }

std::string address_text(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- setup

MulticastEngine::MulticastEngine(BrokerCore& core) : core_(core), settings_(core.options.multicast) {}

Result<std::unique_ptr<MulticastEngine>> MulticastEngine::create(BrokerCore& core) {
  std::unique_ptr<MulticastEngine> e(new MulticastEngine(core));
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
  e->remote_.resize(core.workers.size());
  // A window entry pins a pool buffer: all windows together may pin a quarter of the pool.
  e->window_limit_ = std::max<std::size_t>(core.options.pool_buffers / 4, 16);
  core.multicast_backlog = std::max<std::uint64_t>(
      std::min<std::uint64_t>(e->settings_.retransmit_window, e->window_limit_) / 4, 4);
  return e;
}

MulticastEngine::~MulticastEngine() { stop(); }

void MulticastEngine::start() {
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void MulticastEngine::stop() {
  if (!started_.exchange(false)) return;
  commands_.post(Stop{});
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------- worker side

bool MulticastEngine::eligible(const config::MulticastSettings& settings, std::string_view subject) {
  if (!settings.enabled) return false;
  return std::any_of(settings.subjects.begin(), settings.subjects.end(),
                     [&](const std::string& p) { return proto::pattern_matches(p, subject); });
}

std::uint32_t MulticastEngine::subscribe(std::string_view subject, const ChannelMember& member) {
  std::lock_guard lock(registry_mutex_);
  auto it = by_subject_.find(std::string(subject));
  if (it == by_subject_.end()) {
    Registered r;
    r.id = next_channel_++;
    // The channel stands in the index for all its members: one route per publish.
    r.entry = core_.index.add(subject, Subscriber{kChannelWorker, r.id, 0, core_.multicast_slot, 0});
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
    WindowEntry e{ch->next_sequence++, std::move(p.buf), p.offset, p.len, p.payload_len};
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
  if (!follows || ch.packed_bytes + e.len > room) flush_packed(ch);
  if (e.len > room) {  // alone, in fragments
    send_datagrams(ch, std::span(&e, 1));
    return;
  }
  ch.packed.push_back(WindowEntry{e.sequence, e.buf.clone(), e.offset, e.len, e.payload_len});
  ch.packed_bytes += e.len;
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
  core_.slots->add_queued(m.info.slot, e.len);
  if (!repair) stats_.unicast_copies.add();
  auto& batch = remote_[m.info.worker];
  if (!batch.empty() && batch.back().connection == m.info.connection &&
      extend_delivery(batch.back().item, e.buf, m.info.sid, e.offset, e.len, e.payload_len,
                      core_.options.buffer_size, seq)) {
    return;
  }
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  batch.push_back(
      {m.info.connection, m.info.slot,
       seq != 0 ? make_sequenced_delivery(e.buf.clone(), m.info.sid, seq, e.offset, e.len, e.payload_len, now)
                : make_delivery(e.buf.clone(), m.info.sid, e.offset, e.len, e.payload_len, now)});
}

void MulticastEngine::post_to_workers() { core_.post_deliveries(remote_); }

void MulticastEngine::remember(Channel& ch, WindowEntry entry) {
  ch.window.push_back(std::move(entry));
  ++window_entries_;
  const std::size_t own_limit = std::min<std::size_t>(settings_.retransmit_window, window_limit_);
  while (!ch.window.empty() && (ch.window.size() > own_limit || window_entries_ > window_limit_)) {
    ch.window.pop_front();
    --window_entries_;
  }
}

// ---------------------------------------------------------------- groups

void MulticastEngine::update(Channel& ch) {
  std::size_t can_join = 0;
  for (const Member& m : ch.members) can_join += m.info.can_join && m.mode != MemberMode::kFallback ? 1 : 0;
  const bool want = eligible(settings_, ch.subject) && !ch.join_failed &&
                    can_join >= (ch.grouped ? settings_.leave_below : settings_.threshold);
  if (!want) {
    if (ch.grouped) leave_group(ch);
    return;
  }
  if (!ch.grouped) {
    if (groups_in_use_.size() >= group_count_) {
      spdlog::warn("multicast: no free address in multicast.groups ({}) for {}: it stays unicast",
                   settings_.groups, ch.subject);
      return;
    }
    while (groups_in_use_.contains(next_group_ % group_count_)) ++next_group_;
    ch.group_index = next_group_++ % group_count_;
    groups_in_use_.insert(ch.group_index);
    ch.group = sockaddr_in{};
    ch.group.sin_family = AF_INET;
    ch.group.sin_addr.s_addr = htonl(group_base_ + ch.group_index);
    ch.grouped = true;
    stats_.groups.add(1);
    spdlog::info("multicast: {} moves to group {} ({} members can join)", ch.subject, address_text(ch.group),
                 can_join);
  }
  // Join on every device a member is on; tell members on joined devices to join too.
  for (Member& m : ch.members) {
    if (!m.info.can_join || m.mode != MemberMode::kUnicast) continue;
    DeviceGroup& dg = ch.devices[m.info.device];
    if (!dg.joining && !dg.joined) {
      std::string why;
      Endpoint* ep = endpoint_for(m.info, why);
      bool fail = ep == nullptr;
      if constexpr (fault::kEnabled) {
        if (!fail && fault::Shared::take(core_.faults.mcast_join_fails)) {
          fail = true;
          why = "join refused by fault injection";
        }
      }
      dg.token = next_token_++;
      if (!fail && rdma_join_multicast(ep->id.get(), reinterpret_cast<sockaddr*>(&ch.group),
                                       reinterpret_cast<void*>(dg.token)) != 0) {
        fail = true;
        why = std::string("rdma_join_multicast: ") + std::strerror(errno);
      }
      if (fail) {
        ch.devices.erase(m.info.device);
        stats_.join_failures.add();
        spdlog::warn("multicast: the broker could not join {} for {}: {}; the subject stays unicast",
                     address_text(ch.group), ch.subject, why);
        ch.join_failed = true;
        leave_group(ch);
        return;
      }
      dg.joining = true;
      joins_[dg.token] = {ch.id, m.info.device};
    }
    if (!dg.joined) continue;  // told once the join completes
    proto::McastJoin j;
    j.channel = ch.id;
    j.qkey = dg.remote_qkey;
    // IPv4-mapped IPv6 form.
    j.group[10] = 0xff;
    j.group[11] = 0xff;
    std::memcpy(j.group.data() + 12, &ch.group.sin_addr, 4);
    auto bytes = proto::encode(j);
    OutItem join = make_control(proto::FrameType::kMcastJoin, m.info.sid,
                                std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    // From this sequence on it may take messages from the group.
    join.header.sequence = ch.next_sequence;
    join.fixed_sequence = true;
    m.join_epoch = ch.next_sequence;
    m.mode = MemberMode::kJoining;
    to_member(m, std::move(join));
  }
}

void MulticastEngine::leave_group(Channel& ch) {
  if (!ch.grouped) return;
  flush_packed(ch);
  for (Member& m : ch.members) {
    if (m.mode != MemberMode::kJoining && m.mode != MemberMode::kJoined) continue;
    if (m.mode == MemberMode::kJoined) stats_.members_joined.add(-1);
    m.mode = MemberMode::kUnicast;
    // Everything from here on comes over RC; what it missed before, it repairs.
    OutItem leave = make_control(proto::FrameType::kMcastLeave, m.info.sid);
    leave.header.sequence = ch.next_sequence;
    leave.fixed_sequence = true;
    to_member(m, std::move(leave));
  }
  for (auto& [device, dg] : ch.devices) {
    joins_.erase(dg.token);
    auto ep = endpoints_.find(device);
    if (ep != endpoints_.end() && (dg.joining || dg.joined)) {
      rdma_leave_multicast(ep->second->id.get(), reinterpret_cast<sockaddr*>(&ch.group));
    }
    dg.ah.reset();
  }
  ch.devices.clear();
  groups_in_use_.erase(ch.group_index);
  ch.grouped = false;
  stats_.groups.add(-1);
  spdlog::info("multicast: {} left group {}: unicast again", ch.subject, address_text(ch.group));
}

MulticastEngine::Endpoint* MulticastEngine::endpoint_for(const ChannelMember& m, std::string& why) {
  if (auto it = endpoints_.find(m.device); it != endpoints_.end()) {
    if (it->second->broken) {
      why = "the device's UD QP failed";
      return nullptr;
    }
    return it->second.get();
  }
  auto ep = std::make_unique<Endpoint>();
  ep->device = m.device;
  Device* dev = nullptr;
  verbs::UdEndpointSpec spec;
  spec.cm_channel = cm_channel_.get();
  spec.local = reinterpret_cast<const sockaddr*>(&m.local);
  spec.pd_for = [&](ibv_context* context, std::string& reason) -> ibv_pd* {
    dev = core_.devices != nullptr ? core_.devices->find(context) : nullptr;
    if (dev == nullptr) reason = "the connection's address is on no device the broker uses";
    return dev != nullptr ? dev->pd.get() : nullptr;
  };
  spec.slots = kSlots;
  spec.slot_size = kSlotSize;
  spec.max_send_wr = kSlots;
  spec.max_recv_wr = 1;  // the broker only sends: its own datagrams looped back are dropped
  spec.inline_sends = true;
  if (!verbs::open_ud_endpoint(spec, *ep, why)) return nullptr;
  ibv_port_attr pa{};
  if (ibv_query_port(ep->id->verbs, ep->id->port_num, &pa) != 0) {
    why = std::string("ibv_query_port: ") + std::strerror(errno);
    return nullptr;
  }
  ep->mtu = std::min(mtu_bytes(pa.active_mtu), kSlotSize);
  ep->slot_count = kSlots;
  spdlog::info("multicast: UD endpoint on {} (path MTU {} bytes)", dev->name, ep->mtu);
  return endpoints_.emplace(m.device, std::move(ep)).first->second.get();
}

void MulticastEngine::handle_cm_events() {
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(cm_channel_.get(), &raw) == 0) {
    verbs::CmEventPtr ev(raw);
    const auto token = reinterpret_cast<std::uint64_t>(ev->param.ud.private_data);
    auto j = joins_.find(token);
    if (j == joins_.end()) continue;  // a join the engine has left since
    const auto [channel, device] = j->second;
    Channel* ch = find_channel(channel);
    if (ch == nullptr || !ch->devices.contains(device)) continue;
    DeviceGroup& dg = ch->devices[device];
    if (ev->event == RDMA_CM_EVENT_MULTICAST_JOIN) {
      Endpoint& ep = *endpoints_.at(device);
      dg.ah.reset(ibv_create_ah(ep.qp.get()->pd, &ev->param.ud.ah_attr));
      if (dg.ah) {
        dg.joining = false;
        dg.joined = true;
        dg.remote_qpn = ev->param.ud.qp_num;
        dg.remote_qkey = ev->param.ud.qkey;
        stats_.joins.add();
        update(*ch);  // tells the members on this device
        continue;
      }
      spdlog::warn("multicast: ibv_create_ah for {}: {}", address_text(ch->group), std::strerror(errno));
    } else {
      spdlog::warn("multicast: joining {} for {} failed: {} (status {})", address_text(ch->group),
                   ch->subject, rdma_event_str(ev->event), ev->status);
    }
    stats_.join_failures.add();
    spdlog::warn("multicast: {} stays unicast", ch->subject);
    ch->join_failed = true;
    leave_group(*ch);
  }
}

// ---------------------------------------------------------------- datagrams

void MulticastEngine::send_datagrams(Channel& ch, std::span<const WindowEntry> entries) {
  std::uint32_t total = 0;
  for (const auto& e : entries) total += e.len;
  const bool fragmented = entries.size() == 1 && total > datagram_room(ch);
  bool sent = false;
  for (auto& [device, dg] : ch.devices) {
    if (!dg.joined) continue;
    const bool has_member =
        std::any_of(ch.members.begin(), ch.members.end(), [&, d = device](const Member& m) {
          return m.info.device == d && (m.mode == MemberMode::kJoined || m.mode == MemberMode::kJoining);
        });
    if (!has_member) continue;
    Endpoint& ep = *endpoints_.at(device);
    if (ep.broken) continue;
    const std::uint32_t chunk = static_cast<std::uint32_t>(proto::datagram_chunk(ep.mtu));
    std::uint32_t offset = 0;
    do {
      while (ep.in_flight == ep.slot_count) {
        // Every slot in flight: the device is the bottleneck. Yield rather
        // than spin: a software device (rxe) needs the CPU to complete them.
        poll_sends(ep);
        if (ep.in_flight == ep.slot_count) std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      std::byte* slot = ep.slot(ep.next_slot);
      ep.next_slot = (ep.next_slot + 1) % ep.slot_count;
      std::uint32_t n = 0;
      if (fragmented) {
        n = std::min(chunk, total - offset);
        std::memcpy(slot + proto::kDatagramHeaderSize, entries[0].buf.data() + entries[0].offset + offset, n);
      } else {
        for (const auto& e : entries) {
          std::memcpy(slot + proto::kDatagramHeaderSize + n, e.buf.data() + e.offset, e.len);
          n += e.len;
        }
      }
      const std::uint64_t first = entries.empty() ? ch.next_sequence - 1 : entries[0].sequence;
      proto::encode(slot, proto::DatagramHeader{ch.id, first, total, fragmented ? offset : 0,
                                                static_cast<std::uint32_t>(entries.size())});
      ibv_sge sge{reinterpret_cast<std::uint64_t>(slot),
                  static_cast<std::uint32_t>(proto::kDatagramHeaderSize + n), ep.mr->lkey};
      ibv_send_wr wr{};
      wr.opcode = IBV_WR_SEND;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED | (sge.length <= ep.max_inline ? IBV_SEND_INLINE : 0);
      wr.wr.ud.ah = dg.ah.get();
      wr.wr.ud.remote_qpn = dg.remote_qpn;
      wr.wr.ud.remote_qkey = dg.remote_qkey;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(ep.qp.get(), &wr, &bad) != 0) {
        stats_.send_errors.add();
        spdlog::error("multicast: ibv_post_send on the UD QP failed: {}; {} goes unicast",
                      std::strerror(errno), ch.subject);
        ep.broken = true;
        break;
      }
      ++ep.in_flight;
      stats_.datagrams.add();
      offset += n;
      sent = true;
    } while (fragmented && offset < total);
  }
  if (sent) stats_.group_messages.add(entries.size());
  if (!ch.devices.empty() && std::all_of(ch.devices.begin(), ch.devices.end(), [&](const auto& d) {
        return endpoints_.contains(d.first) && endpoints_.at(d.first)->broken;
      })) {
    ch.join_failed = true;
    leave_group(ch);  // its members get what follows over RC, and repair what this message missed
  }
}

void MulticastEngine::poll_sends(Endpoint& ep) {
  ibv_wc wcs[32];
  int n;
  while ((n = ibv_poll_cq(ep.cq.get(), 32, wcs)) > 0) {
    for (int i = 0; i < n; ++i) {
      if (wcs[i].opcode == IBV_WC_RECV || (wcs[i].opcode & IBV_WC_RECV) != 0) continue;
      --ep.in_flight;
      if (wcs[i].status != IBV_WC_SUCCESS) {
        stats_.send_errors.add();
        if (!ep.broken) {
          spdlog::error("multicast: a UD send failed: {}; no more groups on this device",
                        ibv_wc_status_str(wcs[i].status));
        }
        ep.broken = true;
      }
    }
  }
}

void MulticastEngine::heartbeats() {
  for (auto& [id, ch] : channels_) {
    if (ch.grouped && ch.next_sequence > 1) send_datagrams(ch, {});
  }
}

}  // namespace rdmabroker::daemon
