// SPDX-License-Identifier: Apache-2.0
// One received PUBLISH frame as the stages after the frame handler see it.
//
// The frame handler decodes and validates each frame once
// (proto::decode_frame). What the router, the multicast engine, the queues
// and the accounting need of a PUBLISH frame later (where it lies, how long
// it is, whether it is a fragment and which end of its message it holds) is
// taken from that one decode into a RoutedFrame and travels with the frame,
// then with its OutItem: nothing on the way to the wire reads the header
// again. Only the paths that rewrite frames for an older or smaller peer
// (broker/outbound.cpp: cut_to_fit, split_without_headers, packing) read
// the frames they rewrite.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rdmabroker/proto/wire.hpp"

namespace rdmabroker::daemon {

struct RoutedFrame {
  std::uint32_t offset = 0;       // of its first byte in its receive buffer
  std::uint32_t len = 0;          // the whole frame, padding included
  std::uint32_t payload_len = 0;  // its header block included (SPEC.md §3.6)
  std::uint16_t header_len = 0;   // its header block
  bool fragment = false;          // a publisher's fragment (SPEC.md §3.7): it travels alone
  bool begins = true;             // a whole message, or the fragment that starts one
  bool ends = true;               // a whole message, or the fragment that completes one
  std::uint64_t publisher = 0;    // a fragment's: its publisher's connection id

  /// The facts of a validated PUBLISH frame whose header is `h`, at `offset`.
  static RoutedFrame of(const proto::FrameHeader& h, std::size_t offset) {
    RoutedFrame f;
    f.offset = static_cast<std::uint32_t>(offset);
    f.len = static_cast<std::uint32_t>(h.frame_len());
    f.payload_len = h.payload_len;
    f.header_len = h.header_len;
    f.fragment = h.is_fragment();
    f.begins = h.starts_message();
    f.ends = h.ends_message();
    f.publisher = f.fragment ? h.sequence : 0;
    return f;
  }
  static RoutedFrame of(const proto::Frame& f) { return of(f.header, f.offset); }
};

}  // namespace rdmabroker::daemon
