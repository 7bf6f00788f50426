// SPDX-License-Identifier: Apache-2.0
#include "transport.hpp"

namespace rdmabroker {

void Transport::join_group(std::uint32_t sid, const proto::McastJoin& /*j*/, std::uint64_t epoch) {
  session_.join_done(sid, epoch, "this transport has no multicast");
}

Error connect_rejected(const std::string& where, const proto::ConnectReject& reject) {
  std::string msg =
      "broker at " + where + " refused the connection: " + std::string(proto::to_string(reject.reason));
  if (reject.reason == proto::RejectReason::kBufferTooSmall) {
    msg += " (it needs " + std::to_string(reject.required_buffer_size) + "-byte receive buffers)";
  }
  return Error{ErrorKind::kRejected, msg};
}

}  // namespace rdmabroker
