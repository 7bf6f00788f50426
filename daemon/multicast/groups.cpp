// SPDX-License-Identifier: Apache-2.0
// The multicast engine's group side (engine thread only): when a channel
// moves to a real IB/RoCE group and back (update, leave_group), the UD
// endpoint per device that joins groups and sends datagrams (endpoint_for),
// the group CM events, and the datagram path itself: fragmenting window
// entries into staging slots, posting them, reaping send completions and the
// heartbeats. engine.cpp holds the commands, membership and repair.
#include "multicast/engine.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rdmabroker/proto/multicast.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

namespace {

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

// ---------------------------------------------------------------- groups

void MulticastEngine::update(Channel& ch) {
  std::size_t can_join = 0;
  for (const Member& m : ch.members) can_join += m.info.can_join && m.mode != MemberMode::kFallback ? 1 : 0;
  const bool want = multicast_eligible(settings_, ch.subject) && !ch.join_failed &&
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
    dev = devices_.find(context);
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
  for (const auto& e : entries) total += e.frame.len;
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
        std::memcpy(slot + proto::kDatagramHeaderSize,
                    entries[0].buf.data() + entries[0].frame.offset + offset, n);
      } else {
        for (const auto& e : entries) {
          std::memcpy(slot + proto::kDatagramHeaderSize + n, e.buf.data() + e.frame.offset, e.frame.len);
          n += e.frame.len;
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
