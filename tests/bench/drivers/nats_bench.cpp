// SPDX-License-Identifier: Apache-2.0
// nats_bench: `rdmabroker bench`'s measurement against nats-server, through
// the NATS C client (libnats, Debian's libnats-dev). Same stamp, same
// histogram, same report; only the connection differs. Client settings are
// the library's defaults (flat out it buffers publishes and flushes them from
// its own thread), except that subscriptions have no pending limit, so the
// client never drops a message on its own and every loss is the server's,
// and that at a fixed rate publishes are sent at once (SendAsap), as a
// latency-minded NATS user would: the default flusher waits up to a
// millisecond to gather more. A tls:// URL connects with TLS, trusting the CA
// in RDMABROKER_TLS_CA (as `rdmabroker bench --tls-ca` does; tests/bench/tls.sh).
#include <nats/nats.h>

#include <cstdlib>
#include <string>

#include "bench.hpp"

namespace {

using rdmabroker::bench::BenchEndpoint;

std::string error_text(natsStatus s) {
  natsStatus ignored;
  const char* last = nats_GetLastError(&ignored);
  return std::string(natsStatus_GetText(s)) +
         (last != nullptr && *last != '\0' ? std::string(": ") + last : "");
}

class NatsEndpoint final : public BenchEndpoint {
 public:
  static std::unique_ptr<BenchEndpoint> connect(const std::string& url, bool send_asap, std::string& error) {
    natsOptions* opts = nullptr;
    natsConnection* nc = nullptr;
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, url.c_str());
    if (s == NATS_OK) s = natsOptions_SetAllowReconnect(opts, false);  // a lost connection is a failed run
    if (s == NATS_OK) s = natsOptions_SetSendAsap(opts, send_asap);
    if (s == NATS_OK && url.rfind("tls://", 0) == 0) {
      s = natsOptions_SetSecure(opts, true);
      const char* ca = std::getenv("RDMABROKER_TLS_CA");
      if (s == NATS_OK && ca != nullptr) s = natsOptions_LoadCATrustedCertificates(opts, ca);
    }
    if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
    natsOptions_Destroy(opts);
    if (s != NATS_OK) {
      error = error_text(s);
      return nullptr;
    }
    return std::unique_ptr<BenchEndpoint>(new NatsEndpoint(nc));
  }
  ~NatsEndpoint() override { close(); }

  std::string subscribe(const std::string& subject, const std::string& queue, OnPayload on_payload) override {
    on_payload_ = std::move(on_payload);
    natsStatus s =
        queue.empty() ? natsConnection_Subscribe(&sub_, nc_, subject.c_str(), &NatsEndpoint::on_message, this)
                      : natsConnection_QueueSubscribe(&sub_, nc_, subject.c_str(), queue.c_str(),
                                                      &NatsEndpoint::on_message, this);
    if (s == NATS_OK) s = natsSubscription_SetPendingLimits(sub_, -1, -1);
    if (s != NATS_OK) return error_text(s);
    return flush(std::chrono::seconds(30));
  }
  std::string publish(const std::string& subject, std::span<const std::byte> payload, bool) override {
    const natsStatus s =
        natsConnection_Publish(nc_, subject.c_str(), payload.data(), static_cast<int>(payload.size()));
    return s == NATS_OK ? std::string() : error_text(s);
  }
  std::string flush(std::chrono::milliseconds timeout) override {
    const natsStatus s = natsConnection_FlushTimeout(nc_, timeout.count());
    return s == NATS_OK ? std::string() : error_text(s);
  }
  std::string close() override {
    if (nc_ == nullptr) return {};
    std::string why;
    if (natsConnection_IsClosed(nc_)) {
      const char* last = nullptr;
      natsConnection_GetLastError(nc_, &last);
      why = last != nullptr && *last != '\0' ? last : "connection closed";
    }
    if (sub_ != nullptr) natsSubscription_Destroy(sub_);  // after Close below, no handler runs
    natsConnection_Close(nc_);
    natsConnection_Destroy(nc_);
    sub_ = nullptr;
    nc_ = nullptr;
    return why;
  }
  std::string describe() const override {
    char url[256] = "";
    natsConnection_GetConnectedUrl(nc_, url, sizeof url);
    return std::string("nats ") + url;
  }

 private:
  explicit NatsEndpoint(natsConnection* nc) : nc_(nc) {}
  static void on_message(natsConnection*, natsSubscription*, natsMsg* msg, void* self) {
    auto* e = static_cast<NatsEndpoint*>(self);
    e->on_payload_(std::span(reinterpret_cast<const std::byte*>(natsMsg_GetData(msg)),
                             static_cast<std::size_t>(natsMsg_GetDataLength(msg))));
    natsMsg_Destroy(msg);
  }

  natsConnection* nc_;
  natsSubscription* sub_ = nullptr;
  OnPayload on_payload_;
};

}  // namespace

int main(int argc, char** argv) {
  if (const natsStatus s = nats_Open(-1); s != NATS_OK) return 1;
  const int rc = rdmabroker::bench::driver_main(
      argc, argv, "nats", "nats://127.0.0.1:4222", [](const rdmabroker::bench::BenchOptions& opt) {
        return [asap = opt.rate > 0](std::string& error, const std::string& url) {
          return NatsEndpoint::connect(url, asap, error);
        };
      });
  nats_Close();
  return rc;
}
