// SPDX-License-Identifier: Apache-2.0
// RdmaTransport: the messages this client offers by rendezvous (SPEC.md
// §3.8), each registered on its own for the broker to READ and let go when
// the broker releases it, and the landing areas of large messages it
// receives (§3.9), each registered for the broker to WRITE into until the
// message is whole (rdma_transport.hpp).
#include "rdma_transport.hpp"

namespace rdmabroker {

Result<proto::RendezvousRegion> RdmaTransport::expose_for_read(std::uint64_t offer,
                                                               std::unique_ptr<std::byte[]> data,
                                                               std::size_t length) {
  ExposedRegion region;
  region.mr = verbs::register_offered_message(pd_.get(), data.get(), length);
  if (!region.mr) return sys_error(ErrorKind::kResource, "ibv_reg_mr (an offered message; check ulimit -l)");
  region.data = std::move(data);
  proto::RendezvousRegion r;
  r.address = reinterpret_cast<std::uint64_t>(region.data.get());
  r.rkey = region.mr->rkey;
  exposed_.insert_or_assign(offer, std::move(region));
  return r;
}

void RdmaTransport::release_region(std::uint64_t offer) { exposed_.erase(offer); }

std::optional<std::uint32_t> RdmaTransport::expose_for_write(std::uint32_t sid, std::uint64_t publisher,
                                                             std::byte* data, std::size_t length) {
  verbs::MrPtr mr = verbs::register_landing_area(pd_.get(), data, length);
  if (!mr) return std::nullopt;  // the message comes in fragments instead
  const std::uint32_t rkey = mr->rkey;
  landings_.insert_or_assign({sid, publisher}, std::move(mr));
  return rkey;
}

void RdmaTransport::release_landing(std::uint32_t sid, std::uint64_t publisher) {
  landings_.erase({sid, publisher});
}

}  // namespace rdmabroker
