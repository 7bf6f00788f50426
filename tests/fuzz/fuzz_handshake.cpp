// SPDX-License-Identifier: Apache-2.0
// The handshake private data (rdma_cm connect/accept/reject, and the first
// bytes of a TCP connection): every block decodes to a status without reading
// past its end, a decoded block re-encodes to one that decodes the same, and
// the broker's admission check agrees with the decoder.
#include <cstdint>
#include <span>

#include "broker/admission.hpp"
#include "fuzz_check.hpp"
#include "rdmabroker/proto/handshake.hpp"

namespace proto = rdmabroker::proto;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> b(reinterpret_cast<const std::byte*>(data), size);

  proto::ConnectRequest req;
  const auto req_status = proto::decode(b, req);
  FUZZ_CHECK(!proto::to_string(req_status).empty());
  if (req_status == proto::HandshakeStatus::kOk) {
    proto::ConnectRequest again;
    FUZZ_CHECK(proto::decode(proto::encode(req), again) == proto::HandshakeStatus::kOk);
    FUZZ_CHECK(again.recv_buffer_size == req.recv_buffer_size &&
               again.initial_credits == req.initial_credits);
  }
  rdmabroker::daemon::ConnectionSlots slots(1);
  using Via = rdmabroker::daemon::Admission::Via;
  for (std::uint32_t broker_buffer : {proto::kMinBufferSize, 16384u, proto::kMaxBufferSize}) {
    for (Via via : {Via::kRdma, Via::kTcp}) {
      proto::ConnectRequest admitted;
      const auto refusal = rdmabroker::daemon::Admission(slots, 1, broker_buffer).check(via, b, admitted);
      // Admitted only if it decodes and the client's buffers hold the broker's frames, or it
      // gets version 4 (fragments cut to fit its buffers, SPEC.md §3.7).
      const std::uint8_t version =
          via == Via::kRdma ? proto::connection_version(req) : proto::negotiate_version(req.max_version);
      FUZZ_CHECK(refusal.has_value() ==
                 (req_status != proto::HandshakeStatus::kOk ||
                  (req.recv_buffer_size < broker_buffer && version < proto::kFragmentsVersion)));
      if (refusal) FUZZ_CHECK(!proto::to_string(*refusal).empty());
    }
  }

  proto::ConnectAccept acc;
  if (proto::decode(b, acc) == proto::HandshakeStatus::kOk) {
    proto::ConnectAccept again;
    FUZZ_CHECK(proto::decode(proto::encode(acc), again) == proto::HandshakeStatus::kOk);
    FUZZ_CHECK(again.max_frame_size == acc.max_frame_size && again.connection_id == acc.connection_id);
  }

  proto::ConnectReject rej;
  if (proto::decode(b, rej) == proto::HandshakeStatus::kOk) {
    (void)proto::to_string(rej.reason);  // any value, named or "unknown reason"
    proto::ConnectReject again;
    FUZZ_CHECK(proto::decode(proto::encode(rej), again) == proto::HandshakeStatus::kOk);
    FUZZ_CHECK(again.reason == rej.reason && again.required_buffer_size == rej.required_buffer_size);
  }
  return 0;
}
