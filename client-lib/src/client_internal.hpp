// SPDX-License-Identifier: Apache-2.0
// Internal to librdmabroker: URL parsing and the transport constructors.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include <string_view>

#include "rdmabroker/client.hpp"
#include "rdmabroker/common/url.hpp"

namespace rdmabroker {

/// An error of `kind` for a failed system call, with errno's text.
inline Error sys_error(ErrorKind kind, const std::string& what) {
  return Error{kind, what + ": " + std::strerror(errno)};
}

/// What poll() and wake() of a client with an I/O thread say: `call` is
/// for a polled client only.
inline Error not_polled(std::string_view call) {
  return Error{ErrorKind::kInvalidArgument,
               std::string(call) +
                   " is for a polled client (ClientOptions::polled); this one has "
                   "an I/O thread"};
}

/// A server list ("rdma://a:7470,rdma://b:7470"): its URLs in order; one URL alone is a list of one.
std::vector<std::string> split_urls(std::string_view urls);

/// ClientOptions::reconnect: a client that reconnects (reconnecting_client.cpp).
Result<std::unique_ptr<Client>> connect_reconnecting(std::string_view url, ClientOptions options);

}  // namespace rdmabroker
