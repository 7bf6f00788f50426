// SPDX-License-Identifier: Apache-2.0
// rdmabroker::Headers: the fields of a message's header block (SPEC.md §3.6)
// as the application sees them, and MessageView, a delivered message read in
// place. The wire form is proto/headers.hpp's.
#include <algorithm>

#include "rdmabroker/client.hpp"
#include "rdmabroker/proto/headers.hpp"
#include "session.hpp"

namespace rdmabroker {

namespace {
bool same_name(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}
}  // namespace

Headers::Headers(std::initializer_list<std::pair<std::string_view, std::string_view>> fields) {
  for (const auto& [name, value] : fields) add(name, value);
}

bool Headers::operator==(const Headers& o) const {
  if (fields_.size() != o.fields_.size()) return false;
  for (std::size_t i = 0; i < fields_.size(); ++i)
    if (field(fields_[i]) != o.field(o.fields_[i])) return false;
  return true;
}

void Headers::add(std::string_view name, std::string_view value) {
  Span s;
  s.name_at = static_cast<std::uint32_t>(text_.size());
  s.name_len = static_cast<std::uint32_t>(name.size());
  text_.append(name).push_back('\0');
  s.value_at = static_cast<std::uint32_t>(text_.size());
  s.value_len = static_cast<std::uint32_t>(value.size());
  text_.append(value).push_back('\0');
  fields_.push_back(s);
}

void Headers::set(std::string_view name, std::string_view value) {
  erase(name);
  add(name, value);
}

std::optional<std::string_view> Headers::get(std::string_view name) const {
  for (const auto& [n, v] : *this) {
    if (same_name(n, name)) return v;
  }
  return std::nullopt;
}

std::vector<std::string_view> Headers::values(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const auto& [n, v] : *this) {
    if (same_name(n, name)) out.push_back(v);
  }
  return out;
}

std::size_t Headers::erase(std::string_view name) {
  Headers kept;
  for (const auto& [n, v] : *this) {
    if (!same_name(n, name)) kept.add(n, v);
  }
  const std::size_t removed = size() - kept.size();
  if (removed != 0) *this = std::move(kept);
  return removed;
}

// ---------------------------------------------------------------- MessageView

MessageView::MessageView(const Message& m)
    : sid(m.sid),
      subject(m.subject),
      reply(m.reply),
      payload(m.payload),
      stream_sequence(m.stream_sequence),
      deliveries(m.deliveries),
      message_(&m) {}

bool MessageView::has_headers() const {
  return message_ != nullptr ? !message_->headers.empty() : !header_block_.empty();
}

std::optional<std::string_view> MessageView::header(std::string_view name) const {
  if (message_ != nullptr) return message_->headers.get(name);
  std::optional<std::string_view> found;
  proto::for_each_header(header_block_, [&](std::string_view n, std::string_view v) {
    if (!found && same_name(n, name)) found = v;
  });
  return found;
}

Headers MessageView::headers() const {
  if (message_ != nullptr) return message_->headers;
  Headers h;
  proto::for_each_header(header_block_, [&](std::string_view n, std::string_view v) { h.add(n, v); });
  return h;
}

void MessageView::copy_to(Message& m) const {
  if (message_ == &m) return;
  m.sid = sid;
  m.subject.assign(subject);
  m.reply.assign(reply);
  if (message_ != nullptr) {
    m.headers = message_->headers;
  } else {
    // clear() keeps the storage of a recycled Message.
    m.headers.clear();
    proto::for_each_header(header_block_,
                           [&](std::string_view n, std::string_view v) { m.headers.add(n, v); });
  }
  m.payload.assign(payload.begin(), payload.end());
  m.stream_sequence = stream_sequence;
  m.deliveries = deliveries;
}

Message MessageView::to_message() const {
  Message m;
  copy_to(m);
  return m;
}

}  // namespace rdmabroker
