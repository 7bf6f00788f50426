// SPDX-License-Identifier: Apache-2.0
// One UD endpoint for multicast (SPEC.md §7), as both sides build it: an
// rdma_cm id bound to a local address (so that it lands on that address's
// device and can join groups there), a CQ (with a completion channel when the
// owner sleeps on it), registered memory of `slots` fixed-size slots, and a
// UD QP. The broker's engine sends from its slots; the client receives into
// its slots. Header-only, shared by rdmabrokerd and librdmabroker.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "rdmabroker/common/fd.hpp"
#include "rdmabroker/common/verbs.hpp"

namespace rdmabroker::verbs {

struct UdEndpointSpec {
  rdma_event_channel* cm_channel = nullptr;  // where the id's events (joins) arrive
  const sockaddr* local = nullptr;           // bound with port 0: the device under this address
  /// The PD for the device the id landed on, or null with the reason in `why`.
  std::function<ibv_pd*(ibv_context*, std::string& why)> pd_for;
  bool completion_channel = false;  // the owner sleeps on the CQ (non-blocking channel)
  std::uint32_t slots = 0;
  std::uint32_t slot_size = 0;
  std::uint32_t max_send_wr = 1;
  std::uint32_t max_recv_wr = 1;
  bool inline_sends = false;  // ask for kInlineWanted bytes of inline data (fall back to none)
};

/// Members in creation order: destroying them in reverse (the QP before the
/// MR, CQ and id) is a valid teardown, once the owner left its groups.
struct UdEndpoint {
  CmIdPtr id;
  CompChannelPtr channel;  // null without UdEndpointSpec::completion_channel
  CqPtr cq;
  CqEventAcker acker;  // acks before the CQ is destroyed
  std::unique_ptr<std::byte[]> memory;
  MrPtr mr;
  CmQp qp;
  std::uint32_t slot_size = 0;
  std::uint32_t max_inline = 0;  // what the device granted

  std::byte* slot(std::uint32_t i) const { return memory.get() + std::size_t{i} * slot_size; }
};

/// Builds the endpoint into `ep` (an owner may extend UdEndpoint); false
/// with `why` naming the step that failed (`ep` is then to be discarded).
inline bool open_ud_endpoint(const UdEndpointSpec& spec, UdEndpoint& out, std::string& why) {
  UdEndpoint* ep = &out;
  auto fail = [&](const std::string& what) {
    why = what + ": " + std::strerror(errno);
    return false;
  };
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(spec.cm_channel, &id, nullptr, RDMA_PS_UDP) != 0) return fail("rdma_create_id");
  ep->id.reset(id);
  sockaddr_storage local{};
  std::memcpy(&local, spec.local,
              spec.local->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  reinterpret_cast<sockaddr_in*>(&local)->sin_port = 0;  // the same offset in sockaddr_in6
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&local)) != 0) return fail("rdma_bind_addr");
  ibv_pd* pd = spec.pd_for(id->verbs, why);
  if (pd == nullptr) return false;
  if (spec.completion_channel) {
    ep->channel.reset(ibv_create_comp_channel(id->verbs));
    if (!ep->channel) return fail("ibv_create_comp_channel");
    if (!set_nonblocking(ep->channel->fd)) return fail("O_NONBLOCK on the completion channel");
  }
  const int cqe = static_cast<int>(spec.max_send_wr + spec.max_recv_wr);
  ep->cq.reset(ibv_create_cq(id->verbs, cqe, nullptr, ep->channel.get(), 0));
  if (!ep->cq) return fail("ibv_create_cq");
  ep->acker.attach(ep->cq.get());
  ep->slot_size = spec.slot_size;
  const std::size_t bytes = std::size_t{spec.slots} * spec.slot_size;
  ep->memory.reset(new std::byte[bytes]);
  ep->mr = register_local(pd, ep->memory.get(), bytes);
  if (!ep->mr) return fail("ibv_reg_mr (multicast slots)");
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_UD;
  attr.send_cq = ep->cq.get();
  attr.recv_cq = ep->cq.get();
  attr.cap.max_send_wr = spec.max_send_wr;
  attr.cap.max_recv_wr = spec.max_recv_wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = spec.inline_sends ? kInlineWanted : 0;
  if (rdma_create_qp(id, pd, &attr) != 0) {
    // A device that cannot inline (or not that much) still gets the QP.
    attr.cap.max_inline_data = 0;
    if (!spec.inline_sends || rdma_create_qp(id, pd, &attr) != 0) return fail("rdma_create_qp (UD)");
  }
  ep->qp = CmQp(id);
  ep->max_inline = attr.cap.max_inline_data;
  return true;
}

}  // namespace rdmabroker::verbs
