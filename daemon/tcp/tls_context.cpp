// SPDX-License-Identifier: Apache-2.0
#include "tcp/tls_context.hpp"

#include <openssl/bio.h>

#include <ctime>

namespace rdmabroker::daemon {

namespace {

std::string certificate_summary(SSL_CTX* ctx) {
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (cert == nullptr) return "no certificate";
  char cn[256] = "?";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  std::string until = "?";
  if (BIO* mem = BIO_new(BIO_s_mem())) {
    if (ASN1_TIME_print(mem, X509_get0_notAfter(cert)) == 1) {
      char* data = nullptr;
      const long n = BIO_get_mem_data(mem, &data);
      until.assign(data, static_cast<std::size_t>(n));
    }
    BIO_free(mem);
  }
  return std::string("certificate CN=") + cn + ", valid until " + until;
}

}  // namespace

Result<std::shared_ptr<const TlsContext>> TlsContext::build(const config::TlsSettings& s) {
  ERR_clear_error();
  auto fail = [](const std::string& what) {
    return Error{ErrorKind::kInvalidArgument, what + ": " + tls::take_errors()};
  };
  auto c = std::make_shared<TlsContext>();
  c->settings_ = s;
  c->ctx_.reset(SSL_CTX_new(TLS_server_method()));
  SSL_CTX* ctx = c->ctx_.get();
  if (ctx == nullptr) return fail("tls: SSL_CTX_new");
  SSL_CTX_set_min_proto_version(ctx, tls::protocol_version(s.min_version));
  // No renegotiation (a TLS 1.2 read never has to write), no session
  // tickets (clients connect once and stay), server's cipher order.
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_CIPHER_SERVER_PREFERENCE |
                               SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_num_tickets(ctx, 0);
  // Nor a session cache: with tickets off, OpenSSL would keep every TLS 1.2
  // session (up to 20,480 by default, each with the client's certificate)
  // for resumptions that a client connecting once never asks for.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // Writes are retried from the link's staging buffer, which may move, and
  // an idle connection gives its TLS buffers back.
  SSL_CTX_set_mode(
      ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  if (auto why = tls::use_certificate_and_key(ctx, s.certificate, s.key, "tls.certificate", "tls.key");
      !why.empty()) {
    return Error{ErrorKind::kInvalidArgument, why};
  }
  c->description_ = certificate_summary(ctx);
  if (X509* cert = SSL_CTX_get0_certificate(ctx)) {
    std::tm until{};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &until) == 1) c->not_after_ = timegm(&until);
  }
  if (!s.client_ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, s.client_ca.c_str(), nullptr) != 1)
      return fail("tls.client_ca " + s.client_ca);
    // The CA names sent in the handshake: a client with several
    // certificates picks the one this CA signed.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(s.client_ca.c_str());
    if (names == nullptr) return fail("tls.client_ca " + s.client_ca);
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    c->description_ += "; clients need a certificate from " + s.client_ca;
  }
  return std::shared_ptr<const TlsContext>(std::move(c));
}

tls::UniqueSsl TlsContext::session(int fd) const {
  tls::UniqueSsl ssl(SSL_new(ctx_.get()));
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) return {};
  SSL_set_accept_state(ssl.get());
  return ssl;
}

}  // namespace rdmabroker::daemon
