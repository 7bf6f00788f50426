// SPDX-License-Identifier: Apache-2.0
#include "requests.hpp"

#include <random>

namespace rdmabroker {

std::string PendingRequests::new_inbox() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string inbox = "_INBOX.";
  for (int i = 0; i < 16; ++i) inbox += kHex[rd() % 16];
  return inbox;
}

std::string PendingRequests::open() {
  std::string reply = inbox_ + "." + std::to_string(next_++);
  pending_.emplace(reply, Outcome{});
  return reply;
}

bool PendingRequests::answer(std::string_view subject, const MessageView& reply) {
  auto it = pending_.find(std::string(subject));
  if (it == pending_.end() || it->second.done) return false;
  it->second.done = true;
  reply.copy_to(it->second.reply);
  return true;
}

bool PendingRequests::no_responders(std::string_view subject) {
  auto it = pending_.find(std::string(subject));
  if (it == pending_.end() || it->second.done) return false;
  it->second.done = true;
  it->second.no_responders = true;
  return true;
}

PendingRequests::Outcome PendingRequests::close(const std::string& reply) {
  auto node = pending_.extract(reply);
  return node.empty() ? Outcome{} : std::move(node.mapped());
}

}  // namespace rdmabroker
