// The C API: thin wrappers that turn Result/Status into rb_status codes and
// keep the last error message per thread.
#include <string>

#include "rdmabroker/client.hpp"
#include "rdmabroker/rdmabroker.h"

struct rb_client {
  std::unique_ptr<rdmabroker::Client> impl;
};
struct rb_subscription {
  std::shared_ptr<rdmabroker::Subscription> impl;
};

namespace {

thread_local std::string g_last_error;

struct OwnedMessage {
  rb_message view;
  rdmabroker::Message msg;
};

int code_for(rdmabroker::ErrorKind k) {
  using rdmabroker::ErrorKind;
  switch (k) {
    case ErrorKind::kInvalidArgument: return RB_ERR_INVALID_ARGUMENT;
    case ErrorKind::kConnectFailed: return RB_ERR_CONNECT_FAILED;
    case ErrorKind::kRejected: return RB_ERR_REJECTED;
    case ErrorKind::kTimeout: return RB_ERR_TIMEOUT;
    case ErrorKind::kClosed: return RB_ERR_CLOSED;
    case ErrorKind::kBrokerError: return RB_ERR_BROKER;
    case ErrorKind::kResource: return RB_ERR_RESOURCE;
    case ErrorKind::kPayloadTooLarge: return RB_ERR_PAYLOAD_TOO_LARGE;
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

}  // namespace

extern "C" {

int rb_connect(const char* url, const char* bind_address, rb_client** out) {
  if (url == nullptr || out == nullptr) return invalid("rb_connect: url and out are required");
  rdmabroker::ClientOptions opt;
  if (bind_address != nullptr) opt.bind_address = bind_address;
  auto c = rdmabroker::Client::connect(url, opt);
  if (!c) return fail(c.error());
  *out = new rb_client{std::move(c.value())};
  return RB_OK;
}

int rb_publish(rb_client* c, const char* subject, const void* data, size_t len) {
  if (c == nullptr || subject == nullptr || (data == nullptr && len != 0)) return invalid("rb_publish: bad arguments");
  auto st = c->impl->publish(subject, std::span<const std::byte>(static_cast<const std::byte*>(data), len));
  return st ? RB_OK : fail(st.error());
}

int rb_subscribe(rb_client* c, const char* subject, rb_message_cb cb, void* user, uint32_t* sid_out) {
  if (c == nullptr || subject == nullptr || cb == nullptr) return invalid("rb_subscribe: bad arguments");
  auto r = c->impl->subscribe(subject, [cb, user](const rdmabroker::Message& m) {
    rb_message v{m.sid, m.subject.c_str(), m.payload.data(), m.payload.size(), nullptr};
    cb(&v, user);
  });
  if (!r) return fail(r.error());
  if (sid_out != nullptr) *sid_out = r.value();
  return RB_OK;
}

int rb_subscribe_sync(rb_client* c, const char* subject, rb_subscription** out) {
  if (c == nullptr || subject == nullptr || out == nullptr) return invalid("rb_subscribe_sync: bad arguments");
  auto r = c->impl->subscribe(std::string_view(subject));
  if (!r) return fail(r.error());
  *out = new rb_subscription{std::move(r.value())};
  return RB_OK;
}

int rb_next_message(rb_subscription* s, int timeout_ms, rb_message** out) {
  if (s == nullptr || out == nullptr) return invalid("rb_next_message: bad arguments");
  auto r = s->impl->next(std::chrono::milliseconds(timeout_ms));
  if (!r) return fail(r.error());
  auto* owned = new OwnedMessage{{}, std::move(r.value())};
  owned->view = rb_message{owned->msg.sid, owned->msg.subject.c_str(), owned->msg.payload.data(), owned->msg.payload.size(), owned};
  *out = &owned->view;
  return RB_OK;
}

void rb_message_free(rb_message* m) {
  if (m != nullptr) delete static_cast<OwnedMessage*>(m->owner_);
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

void rb_close(rb_client* c) {
  if (c == nullptr) return;
  c->impl->close();
  delete c;
}

const char* rb_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
