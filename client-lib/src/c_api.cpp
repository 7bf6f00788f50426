// SPDX-License-Identifier: Apache-2.0
// The C API: thin wrappers that turn Result/Status into rb_status codes and
// keep the last error message per thread.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <strings.h>

#include "rdmabroker/client.hpp"
#include "rdmabroker/consumer.hpp"
#include "rdmabroker/rdmabroker.h"

struct rb_client {
  std::unique_ptr<rdmabroker::Client> impl;
};
struct rb_consumer {
  std::shared_ptr<rdmabroker::Consumer> impl;
};
struct rb_subscription {
  std::shared_ptr<rdmabroker::Subscription> impl;
};

namespace {

thread_local std::string g_last_error;

struct OwnedMessage {
  rb_message view;
  rdmabroker::Message msg;
  std::vector<rb_header> headers;  // views of msg.headers
};

int code_for(rdmabroker::ErrorKind k) {
  using rdmabroker::ErrorKind;
  switch (k) {
    case ErrorKind::kInvalidArgument:
      return RB_ERR_INVALID_ARGUMENT;
    case ErrorKind::kConnectFailed:
      return RB_ERR_CONNECT_FAILED;
    case ErrorKind::kRejected:
      return RB_ERR_REJECTED;
    case ErrorKind::kTimeout:
      return RB_ERR_TIMEOUT;
    case ErrorKind::kClosed:
      return RB_ERR_CLOSED;
    case ErrorKind::kBrokerError:
      return RB_ERR_BROKER;
    case ErrorKind::kResource:
      return RB_ERR_RESOURCE;
    case ErrorKind::kPayloadTooLarge:
      return RB_ERR_PAYLOAD_TOO_LARGE;
    case ErrorKind::kNoResponders:
      return RB_ERR_NO_RESPONDERS;
    case ErrorKind::kAuthenticationFailed:
      return RB_ERR_AUTHENTICATION;
    case ErrorKind::kPermissionDenied:
      return RB_ERR_PERMISSION_DENIED;
    case ErrorKind::kMessagesLost:
      return RB_ERR_MESSAGES_LOST;
    case ErrorKind::kNoStream:
      return RB_ERR_NO_STREAM;
    case ErrorKind::kStreamFull:
      return RB_ERR_STREAM_FULL;
    case ErrorKind::kDiskFull:
      return RB_ERR_DISK_FULL;
    case ErrorKind::kConsumerInvalid:
      return RB_ERR_CONSUMER_INVALID;
  }
  return RB_ERR_INVALID_ARGUMENT;
}

int fail(const rdmabroker::Error& e) {
  g_last_error = e.message;
  return code_for(e.kind);
}

int invalid(const char* what) {
  g_last_error = what;
  return RB_ERR_INVALID_ARGUMENT;
}

/// `m` for C; `headers` holds the header views and must live as long as the result.
rb_message view_of(const rdmabroker::Message& m, void* owner, std::vector<rb_header>& headers) {
  headers.clear();
  // Headers keeps each name and value NUL-terminated in its storage.
  for (const auto& [name, value] : m.headers) headers.push_back(rb_header{name.data(), value.data()});
  return rb_message{m.sid,
                    m.subject.c_str(),
                    m.reply.c_str(),
                    m.payload.data(),
                    m.payload.size(),
                    owner,
                    headers.empty() ? nullptr : headers.data(),
                    headers.size(),
                    m.stream_sequence,
                    m.deliveries};
}

rb_message* owned_copy(rdmabroker::Message m) {
  auto* owned = new OwnedMessage{{}, std::move(m), {}};
  owned->view = view_of(owned->msg, owned, owned->headers);
  return &owned->view;
}

/// C header fields as the C++ API takes them.
rdmabroker::Headers headers_of(const rb_header* fields, size_t count) {
  rdmabroker::Headers h;
  for (size_t i = 0; i < count; ++i) h.add(fields[i].name, fields[i].value);
  return h;
}

bool valid_fields(const rb_header* fields, size_t count) {
  if (count != 0 && fields == nullptr) return false;
  for (size_t i = 0; i < count; ++i) {
    if (fields[i].name == nullptr || fields[i].value == nullptr) return false;
  }
  return true;
}

std::span<const std::byte> bytes(const void* data, size_t len) {
  return {static_cast<const std::byte*>(data), len};
}

/// A ServerInfo and its C view, which points into it.
struct OwnedServerInfo {
  rb_server_info view{};
  rdmabroker::ServerInfo info;
  std::vector<std::string> client_urls;
  std::vector<const char*> strings;  // every list's pointers, back to back
  std::vector<rb_broker_info> peers;
};

OwnedServerInfo* owned_info(rdmabroker::ServerInfo info) {
  auto* o = new OwnedServerInfo{};
  o->info = std::move(info);
  o->client_urls = o->info.client_urls();
  // Offsets first: `strings` must not move once views point into it.
  std::size_t total = o->client_urls.size();
  auto count = [&](const rdmabroker::ServerInfo::Broker& b) { total += b.urls.size() + b.routes.size(); };
  count(o->info.self);
  for (const auto& p : o->info.peers) count(p);
  o->strings.reserve(total);
  auto list = [&](const std::vector<std::string>& from) {
    const char* const* at = o->strings.data() + o->strings.size();
    for (const auto& s : from) o->strings.push_back(s.c_str());
    return from.empty() ? nullptr : at;
  };
  auto broker = [&](const rdmabroker::ServerInfo::Broker& b) {
    rb_broker_info v{b.id.c_str(), nullptr, b.urls.size(), nullptr, b.routes.size()};
    v.urls = list(b.urls);
    v.routes = list(b.routes);
    return v;
  };
  o->view.self = broker(o->info.self);
  for (const auto& p : o->info.peers) o->peers.push_back(broker(p));
  o->view.cluster = o->info.cluster.c_str();
  o->view.peers = o->peers.empty() ? nullptr : o->peers.data();
  o->view.peer_count = o->peers.size();
  o->view.client_urls = list(o->client_urls);
  o->view.client_url_count = o->client_urls.size();
  o->view.owner_ = o;
  return o;
}

int subscribe_cb(rb_client* c, const char* subject, const char* group, rb_message_cb cb, void* user,
                 uint32_t* sid_out) {
  auto r = c->impl->queue_subscribe(subject, group != nullptr ? group : "",
                                    [cb, user](const rdmabroker::Message& m) {
                                      thread_local std::vector<rb_header> headers;
                                      rb_message v = view_of(m, nullptr, headers);
                                      cb(&v, user);
                                    });
  if (!r) return fail(r.error());
  if (sid_out != nullptr) *sid_out = r.value();
  return RB_OK;
}

int subscribe_view_cb(rb_client* c, const char* subject, const char* group, rb_view_cb cb, void* user,
                      uint32_t* sid_out) {
  auto r = c->impl->queue_subscribe_view(
      subject, group != nullptr ? group : "", [cb, user](const rdmabroker::MessageView& m) {
        const rb_message_view v{m.sid,          m.subject.data(), m.subject.size(), m.reply.data(),
                                m.reply.size(), m.payload.data(), m.payload.size(), &m};
        cb(&v, user);
      });
  if (!r) return fail(r.error());
  if (sid_out != nullptr) *sid_out = r.value();
  return RB_OK;
}

int subscribe_sync(rb_client* c, const char* subject, const char* group, rb_subscription** out) {
  auto r = c->impl->queue_subscribe(std::string_view(subject), group != nullptr ? group : "");
  if (!r) return fail(r.error());
  *out = new rb_subscription{std::move(r.value())};
  return RB_OK;
}

}  // namespace

extern "C" {

int rb_connect(const char* url, const char* bind_address, rb_client** out) {
  rb_options o;
  rb_options_init(&o);
  o.bind_address = bind_address;
  return rb_connect_with(url, &o, out);
}

void rb_options_init_sized(rb_options* options, size_t size) {
  if (options == nullptr || size < sizeof(options->size)) return;
  // A newer caller's struct is longer: its fields past ours are zero too,
  // and rb_connect_with reads only as far as it knows.
  std::memset(static_cast<void*>(options), 0, size);
  options->size = size;
}

// The function behind the header's macro (the parentheses keep it from
// expanding), for programs compiled before it: their struct is ours.
void(rb_options_init)(rb_options* options) { rb_options_init_sized(options, sizeof(rb_options)); }

int rb_connect_with(const char* url, const rb_options* options, rb_client** out) {
  if (url == nullptr || out == nullptr) return invalid("rb_connect_with: url and out are required");
  rb_options o;
  rb_options_init(&o);
  if (options != nullptr) {
    // An older caller's struct is shorter: take what it has, default the rest.
    if (options->size < offsetof(rb_options, bind_address))
      return invalid("rb_connect_with: options.size not set");
    std::memcpy(&o, options, std::min(options->size, sizeof(rb_options)));
  }
  rdmabroker::ClientOptions opt;
  auto text = [](const char* s) { return s != nullptr ? std::string(s) : std::string(); };
  auto ms = [](int v, std::chrono::milliseconds fallback) {
    return v > 0 ? std::chrono::milliseconds(v) : fallback;
  };
  if (o.connect_timeout_ms < 0 || o.publish_timeout_ms < 0 || o.reconnect_delay_ms < 0 ||
      o.reconnect_max_delay_ms < 0 || o.max_reconnect_attempts < 0) {
    return invalid("rb_connect_with: negative timeout, delay or attempt count");
  }
  opt.bind_address = text(o.bind_address);
  opt.user = text(o.user);
  opt.password = text(o.password);
  opt.token = text(o.token);
  opt.tls_ca_file = text(o.tls_ca_file);
  opt.tls_cert_file = text(o.tls_cert_file);
  opt.tls_key_file = text(o.tls_key_file);
  opt.tls_server_name = text(o.tls_server_name);
  opt.reconnect = o.reconnect != 0;
  opt.polled = o.polled != 0;
  opt.adaptive_poll = o.adaptive_poll != 0;
  opt.ignore_announced_servers = o.ignore_announced_servers != 0;
  opt.rendezvous = o.no_rendezvous == 0;
  if (o.on_server_info != nullptr) {
    opt.on_server_info = [cb = o.on_server_info,
                          user = o.on_server_info_user](const rdmabroker::ServerInfo& i) {
      const std::unique_ptr<OwnedServerInfo> owned(owned_info(i));
      cb(&owned->view, user);
    };
  }
  opt.max_reconnect_attempts = static_cast<std::uint32_t>(o.max_reconnect_attempts);
  opt.connect_timeout = ms(o.connect_timeout_ms, opt.connect_timeout);
  opt.publish_timeout = ms(o.publish_timeout_ms, opt.publish_timeout);
  opt.reconnect_delay = ms(o.reconnect_delay_ms, opt.reconnect_delay);
  opt.reconnect_max_delay = ms(o.reconnect_max_delay_ms, opt.reconnect_max_delay);
  if (o.on_error != nullptr) {
    opt.on_error = [cb = o.on_error, user = o.on_error_user](const rdmabroker::Error& e) {
      cb(code_for(e.kind), e.message.c_str(), user);
    };
  }
  if (o.on_connection_event != nullptr) {
    opt.on_connection_event = [cb = o.on_connection_event,
                               user = o.on_connection_event_user](const rdmabroker::ConnectionEvent& e) {
      using K = rdmabroker::ConnectionEvent::Kind;
      const rb_connection_event kind = e.kind == K::kDisconnected  ? RB_DISCONNECTED
                                       : e.kind == K::kReconnected ? RB_RECONNECTED
                                                                   : RB_GAVE_UP;
      cb(kind, e.reason.message.c_str(), user);
    };
  }
  auto c = rdmabroker::Client::connect(url, opt);
  if (!c) return fail(c.error());
  *out = new rb_client{std::move(c.value())};
  return RB_OK;
}

int rb_publish(rb_client* c, const char* subject, const void* data, size_t len) {
  if (c == nullptr || subject == nullptr || (data == nullptr && len != 0))
    return invalid("rb_publish: bad arguments");
  auto st = c->impl->publish(subject, bytes(data, len));
  return st ? RB_OK : fail(st.error());
}

int rb_publish_request(rb_client* c, const char* subject, const char* reply, const void* data, size_t len) {
  if (c == nullptr || subject == nullptr || reply == nullptr || (data == nullptr && len != 0)) {
    return invalid("rb_publish_request: bad arguments");
  }
  auto st = c->impl->publish_request(subject, reply, bytes(data, len));
  return st ? RB_OK : fail(st.error());
}

int rb_publish_headers(rb_client* c, const char* subject, const char* reply, const rb_header* headers,
                       size_t count, const void* data, size_t len) {
  if (c == nullptr || subject == nullptr || !valid_fields(headers, count) || (data == nullptr && len != 0)) {
    return invalid("rb_publish_headers: bad arguments");
  }
  auto st =
      c->impl->publish(subject, headers_of(headers, count), bytes(data, len), reply != nullptr ? reply : "");
  return st ? RB_OK : fail(st.error());
}

int rb_publish_acked(rb_client* c, const char* subject, const rb_header* headers, size_t count,
                     const void* data, size_t len, int timeout_ms, rb_pub_ack* out) {
  if (c == nullptr || subject == nullptr || !valid_fields(headers, count) || (data == nullptr && len != 0) ||
      timeout_ms < 0) {
    return invalid("rb_publish_acked: bad arguments");
  }
  auto r = c->impl->publish_acked(subject, headers_of(headers, count), bytes(data, len),
                                  std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  if (out != nullptr) {
    const std::size_t n = std::min(r->stream.size(), sizeof out->stream - 1);
    std::memcpy(out->stream, r->stream.data(), n);
    out->stream[n] = '\0';
    out->sequence = r->sequence;
    out->duplicate = r->duplicate ? 1 : 0;
  }
  return RB_OK;
}

int rb_request_headers(rb_client* c, const char* subject, const rb_header* headers, size_t count,
                       const void* data, size_t len, int timeout_ms, rb_message** out) {
  if (c == nullptr || subject == nullptr || out == nullptr || !valid_fields(headers, count) ||
      (data == nullptr && len != 0)) {
    return invalid("rb_request_headers: bad arguments");
  }
  auto r = c->impl->request(subject, headers_of(headers, count), bytes(data, len),
                            std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  *out = owned_copy(std::move(r.value()));
  return RB_OK;
}

const char* rb_message_header(const rb_message* m, const char* name) {
  if (m == nullptr || name == nullptr) return nullptr;
  for (size_t i = 0; i < m->header_count; ++i) {
    if (strcasecmp(m->headers[i].name, name) == 0) return m->headers[i].value;
  }
  return nullptr;
}

int rb_request(rb_client* c, const char* subject, const void* data, size_t len, int timeout_ms,
               rb_message** out) {
  if (c == nullptr || subject == nullptr || out == nullptr || (data == nullptr && len != 0)) {
    return invalid("rb_request: bad arguments");
  }
  auto r = c->impl->request(subject, bytes(data, len), std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  *out = owned_copy(std::move(r.value()));
  return RB_OK;
}

int rb_subscribe(rb_client* c, const char* subject, rb_message_cb cb, void* user, uint32_t* sid_out) {
  if (c == nullptr || subject == nullptr || cb == nullptr) return invalid("rb_subscribe: bad arguments");
  return subscribe_cb(c, subject, nullptr, cb, user, sid_out);
}

int rb_queue_subscribe(rb_client* c, const char* subject, const char* group, rb_message_cb cb, void* user,
                       uint32_t* sid_out) {
  if (c == nullptr || subject == nullptr || group == nullptr || cb == nullptr) {
    return invalid("rb_queue_subscribe: bad arguments");
  }
  return subscribe_cb(c, subject, group, cb, user, sid_out);
}

int rb_subscribe_view(rb_client* c, const char* subject, rb_view_cb cb, void* user, uint32_t* sid_out) {
  if (c == nullptr || subject == nullptr || cb == nullptr) return invalid("rb_subscribe_view: bad arguments");
  return subscribe_view_cb(c, subject, nullptr, cb, user, sid_out);
}

int rb_queue_subscribe_view(rb_client* c, const char* subject, const char* group, rb_view_cb cb, void* user,
                            uint32_t* sid_out) {
  if (c == nullptr || subject == nullptr || group == nullptr || cb == nullptr) {
    return invalid("rb_queue_subscribe_view: bad arguments");
  }
  return subscribe_view_cb(c, subject, group, cb, user, sid_out);
}

const char* rb_view_header(const rb_message_view* m, const char* name, size_t* value_len) {
  if (m == nullptr || m->internal_ == nullptr || name == nullptr) return nullptr;
  const auto value = static_cast<const rdmabroker::MessageView*>(m->internal_)->header(name);
  if (!value) return nullptr;
  if (value_len != nullptr) *value_len = value->size();
  return value->data();
}

int64_t rb_view_received_ns(const rb_message_view* m) {
  if (m == nullptr || m->internal_ == nullptr) return 0;
  // libstdc++'s steady_clock is CLOCK_MONOTONIC, in nanoseconds.
  return static_cast<const rdmabroker::MessageView*>(m->internal_)->received_at.time_since_epoch().count();
}

uint64_t rb_view_relay_ns(const rb_message_view* m) {
  if (m == nullptr || m->internal_ == nullptr) return 0;
  return static_cast<std::uint64_t>(
      static_cast<const rdmabroker::MessageView*>(m->internal_)->relay_time.count());
}

int rb_subscribe_sync(rb_client* c, const char* subject, rb_subscription** out) {
  if (c == nullptr || subject == nullptr || out == nullptr)
    return invalid("rb_subscribe_sync: bad arguments");
  return subscribe_sync(c, subject, nullptr, out);
}

int rb_queue_subscribe_sync(rb_client* c, const char* subject, const char* group, rb_subscription** out) {
  if (c == nullptr || subject == nullptr || group == nullptr || out == nullptr) {
    return invalid("rb_queue_subscribe_sync: bad arguments");
  }
  return subscribe_sync(c, subject, group, out);
}

int rb_next_message(rb_subscription* s, int timeout_ms, rb_message** out) {
  if (s == nullptr || out == nullptr) return invalid("rb_next_message: bad arguments");
  auto r = s->impl->next(std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  *out = owned_copy(std::move(r.value()));
  return RB_OK;
}

void rb_message_free(rb_message* m) {
  if (m != nullptr) delete static_cast<OwnedMessage*>(m->owner_);
}

void rb_consumer_options_init(rb_consumer_options* o) {
  if (o == nullptr) return;
  const rdmabroker::ConsumerOptions d;
  *o = rb_consumer_options{
      nullptr,       RB_START_ALL,      0, 0, RB_ACK_EXPLICIT, static_cast<int>(d.ack_wait.count()),
      d.max_deliver, d.max_ack_pending, 0, 0};
}

int rb_consume(rb_client* c, const char* stream, const rb_consumer_options* o, int timeout_ms,
               rb_consumer** out, uint64_t* pending) {
  rb_consumer_options d;
  rb_consumer_options_init(&d);
  if (o == nullptr) o = &d;
  if (c == nullptr || stream == nullptr || out == nullptr || timeout_ms < 0 || o->start < RB_START_ALL ||
      o->start > RB_START_TIME || o->ack < RB_ACK_NONE || o->ack > RB_ACK_CUMULATIVE || o->ack_wait_ms < 0)
    return invalid("rb_consume: bad arguments");
  rdmabroker::ConsumerOptions opt;
  opt.durable = o->durable != nullptr ? o->durable : "";
  opt.start = static_cast<rdmabroker::ConsumerOptions::Start>(o->start);
  opt.start_sequence = o->start_sequence;
  opt.start_time =
      std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(o->start_time_ns)));
  opt.ack = static_cast<rdmabroker::ConsumerOptions::Ack>(o->ack);
  opt.ack_wait = std::chrono::milliseconds(o->ack_wait_ms);
  opt.max_deliver = o->max_deliver;
  opt.max_ack_pending = o->max_ack_pending;
  opt.pull = o->pull != 0;
  opt.original_pace = o->original_pace != 0;
  auto r = c->impl->consume(stream, opt, std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  if (pending != nullptr) *pending = r.value()->pending_at_open();
  *out = new rb_consumer{std::move(r.value())};
  return RB_OK;
}

int rb_consumer_next(rb_consumer* k, int timeout_ms, rb_message** out) {
  if (k == nullptr || out == nullptr) return invalid("rb_consumer_next: bad arguments");
  auto r = k->impl->next(std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  *out = owned_copy(std::move(r.value()));
  return RB_OK;
}

int rb_consumer_fetch(rb_consumer* k, size_t count, int timeout_ms, rb_message** out, size_t* got) {
  if (k == nullptr || (out == nullptr && count != 0) || got == nullptr)
    return invalid("rb_consumer_fetch: bad arguments");
  *got = 0;
  auto r = k->impl->fetch(count, std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  for (auto& m : r.value()) out[(*got)++] = owned_copy(std::move(m));
  return RB_OK;
}

int rb_consumer_ack(rb_consumer* k, const rb_message* m) {
  if (k == nullptr || m == nullptr || m->owner_ == nullptr) return invalid("rb_consumer_ack: bad arguments");
  auto st = k->impl->ack(static_cast<const OwnedMessage*>(m->owner_)->msg);
  return st ? RB_OK : fail(st.error());
}

int rb_consumer_nak(rb_consumer* k, const rb_message* m) {
  if (k == nullptr || m == nullptr || m->owner_ == nullptr) return invalid("rb_consumer_nak: bad arguments");
  auto st = k->impl->nak(static_cast<const OwnedMessage*>(m->owner_)->msg);
  return st ? RB_OK : fail(st.error());
}

void rb_consumer_close(rb_consumer* k) {
  if (k == nullptr) return;
  (void)k->impl->close();
  delete k;
}

uint32_t rb_subscription_sid(const rb_subscription* s) { return s != nullptr ? s->impl->sid() : 0; }

void rb_subscription_free(rb_subscription* s) { delete s; }

int rb_unsubscribe(rb_client* c, uint32_t sid) {
  if (c == nullptr) return invalid("rb_unsubscribe: no client");
  auto st = c->impl->unsubscribe(sid);
  return st ? RB_OK : fail(st.error());
}

int rb_flush(rb_client* c, int timeout_ms) {
  if (c == nullptr) return invalid("rb_flush: no client");
  auto st = c->impl->flush(std::chrono::milliseconds(timeout_ms));
  return st ? RB_OK : fail(st.error());
}

int rb_poll(rb_client* c, long timeout_us, size_t* delivered) {
  if (c == nullptr) return invalid("rb_poll: no client");
  auto n = c->impl->poll(std::chrono::microseconds(timeout_us));
  if (!n) return fail(n.error());
  if (delivered != nullptr) *delivered = n.value();
  return RB_OK;
}

int rb_wake(rb_client* c) {
  if (c == nullptr) return invalid("rb_wake: no client");
  if (auto st = c->impl->wake(); !st) return fail(st.error());
  return RB_OK;
}

int rb_server_info_get(rb_client* c, rb_server_info** out) {
  if (c == nullptr || out == nullptr) return invalid("rb_server_info_get: bad arguments");
  *out = &owned_info(c->impl->server_info())->view;
  return RB_OK;
}

void rb_server_info_free(rb_server_info* info) {
  if (info != nullptr) delete static_cast<OwnedServerInfo*>(info->owner_);
}

void rb_close(rb_client* c) {
  if (c == nullptr) return;
  c->impl->close();
  delete c;
}

const char* rb_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
