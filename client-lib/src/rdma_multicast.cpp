// SPDX-License-Identifier: Apache-2.0
// The multicast side of the RDMA transport (SPEC.md §7): one UD endpoint on
// the connection's device, joined to the groups of the subscriptions the
// broker serves by multicast; its datagrams go to the Session.
#include <arpa/inet.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

#include "rdma_transport.hpp"

namespace rdmabroker {

bool RdmaTransport::open_ud(std::string& why) {
  if (ud_) return true;
  if (ud_failed_) {
    why = ud_error_;
    return false;
  }
  auto fail = [&](const std::string& what) {
    ud_failed_ = true;
    ud_error_ = what;
    why = ud_error_;
    teardown_ud();
    return false;
  };
  ud_cm_channel_.reset(rdma_create_event_channel());
  if (!ud_cm_channel_) return fail(std::string("rdma_create_event_channel: ") + std::strerror(errno));
  set_nonblocking(ud_cm_channel_->fd);
  verbs::UdEndpointSpec spec;
  spec.cm_channel = ud_cm_channel_.get();
  // On the connection's own address: the device the broker reaches us on.
  spec.local = rdma_get_local_addr(id_.get());
  spec.pd_for = [this](ibv_context* context, std::string& reason) -> ibv_pd* {
    if (context == id_->verbs) return pd_.get();
    reason = "the UD endpoint is not on the connection's device";
    return nullptr;
  };
  spec.completion_channel = true;
  spec.slots = kUdRecvs;
  spec.slot_size = kUdBufferSize;
  spec.max_recv_wr = kUdRecvs;
  ud_ = std::make_unique<verbs::UdEndpoint>();
  std::string step;
  if (!verbs::open_ud_endpoint(spec, *ud_, step)) return fail(step);
  for (std::uint32_t i = 0; i < kUdRecvs; ++i) post_ud_receive(i);
  for (int fd : {ud_cm_channel_->fd, ud_->channel->fd}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e);
  }
  ibv_req_notify_cq(ud_->cq.get(), 0);
  return true;
}

void RdmaTransport::post_ud_receive(std::uint32_t index) {
  // Fails only once the QP is in error: then nothing arrives anyway.
  verbs::post_receive(ud_->qp.get(), ud_->slot(index), kUdBufferSize, ud_->mr->lkey, index);
}

void RdmaTransport::teardown_ud() {
  // Groups first: the kernel refuses to destroy a QP still attached to one
  // (EBUSY), and the CQ and completion channel would leak with it.
  if (ud_ && ud_->id) {
    for (auto& [channel, g] : groups_)
      rdma_leave_multicast(ud_->id.get(), reinterpret_cast<sockaddr*>(&g.addr));
  }
  groups_.clear();
  // Then the endpoint (its members in reverse order of creation), then its CM channel.
  ud_.reset();
  ud_cm_channel_.reset();
  groups_.clear();
  group_of_.clear();
  groups_joined_.store(0, std::memory_order_relaxed);
}

void RdmaTransport::join_group(std::uint32_t sid, const proto::McastJoin& j, std::uint64_t epoch) {
  leave_group(sid);  // a subscription is in one group at a time
  std::string why;
  if (fail_joins_) {
    session_.join_done(sid, epoch, "join refused (RDMABROKER_TEST_FAIL_MCAST_JOIN)");
    return;
  }
  static constexpr std::uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(j.group.data(), kV4Mapped, sizeof kV4Mapped) != 0) {
    session_.join_done(sid, epoch, "only IPv4 (RoCE v2) groups are supported");
    return;
  }
  if (!open_ud(why)) {
    session_.join_done(sid, epoch, why);
    return;
  }
  auto [it, created] = groups_.try_emplace(j.channel);
  Group& g = it->second;
  if (created) {
    g.addr.sin_family = AF_INET;
    std::memcpy(&g.addr.sin_addr, j.group.data() + 12, 4);
    if (rdma_join_multicast(ud_->id.get(), reinterpret_cast<sockaddr*>(&g.addr),
                            reinterpret_cast<void*>(static_cast<std::uintptr_t>(j.channel))) != 0) {
      groups_.erase(it);
      session_.join_done(sid, epoch, std::string("rdma_join_multicast: ") + std::strerror(errno));
      return;
    }
  }
  g.sids.insert(sid);
  group_of_[sid] = j.channel;
  if (g.joined) {
    session_.join_done(sid, epoch, {});
  } else {
    g.waiting.emplace_back(sid, epoch);
  }
}

void RdmaTransport::leave_group(std::uint32_t sid) {
  auto of = group_of_.find(sid);
  if (of == group_of_.end()) return;
  auto it = groups_.find(of->second);
  group_of_.erase(of);
  if (it == groups_.end()) return;
  Group& g = it->second;
  g.sids.erase(sid);
  std::erase_if(g.waiting, [&](const auto& w) { return w.first == sid; });
  if (!g.sids.empty()) return;
  rdma_leave_multicast(ud_->id.get(), reinterpret_cast<sockaddr*>(&g.addr));
  if (g.joined) groups_joined_.fetch_sub(1, std::memory_order_relaxed);
  groups_.erase(it);
}

void RdmaTransport::handle_group_events() {
  rdma_cm_event* raw = nullptr;
  while (rdma_get_cm_event(ud_cm_channel_.get(), &raw) == 0) {
    verbs::CmEventPtr ev(raw);
    const auto channel =
        static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(ev->param.ud.private_data));
    auto it = groups_.find(channel);
    if (it == groups_.end()) continue;  // left meanwhile
    Group& g = it->second;
    const auto waiting = std::exchange(g.waiting, {});
    if (ev->event == RDMA_CM_EVENT_MULTICAST_JOIN) {
      if (!g.joined) groups_joined_.fetch_add(1, std::memory_order_relaxed);
      g.joined = true;
      for (const auto& [sid, epoch] : waiting) session_.join_done(sid, epoch, {});
      continue;
    }
    const std::string why =
        std::string(rdma_event_str(ev->event)) + " (status " + std::to_string(ev->status) + ")";
    for (const auto& [sid, epoch] : waiting) {
      session_.join_done(sid, epoch, why);
      group_of_.erase(sid);
    }
    if (!g.joined) groups_.erase(it);
  }
}

void RdmaTransport::drain_ud(Deliveries& deliveries) {
  for (int pass = 0; pass < 2; ++pass) {
    ibv_wc wcs[32];
    int got;
    while ((got = ibv_poll_cq(ud_->cq.get(), 32, wcs)) > 0) {
      for (int i = 0; i < got; ++i) {
        const auto& wc = wcs[i];
        if (wc.status != IBV_WC_SUCCESS) continue;  // flushed at teardown
        const auto index = static_cast<std::uint32_t>(wc.wr_id);
        const std::byte* buf = ud_->slot(index);
        if (wc.byte_len > proto::kGrhSize) {
          session_.on_datagram({buf + proto::kGrhSize, wc.byte_len - proto::kGrhSize}, deliveries);
        }
        post_ud_receive(index);
      }
    }
    if (pass == 0) ibv_req_notify_cq(ud_->cq.get(), 0);
  }
}

}  // namespace rdmabroker
