// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "client_internal.hpp"

namespace rdmabroker {
namespace {

TEST(Url, Parses) {
  auto u = parse_url("rdma://10.0.0.1:9000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme, "rdma");
  EXPECT_EQ(u->host, "10.0.0.1");
  EXPECT_EQ(u->port, 9000);
  auto d = parse_url("rdma://broker.local/");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->host, "broker.local");
  EXPECT_EQ(d->port, kDefaultPort);
  auto v6 = parse_url("rdma://[fe80::1]:7000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fe80::1");
  EXPECT_EQ(v6->port, 7000);
  auto t = parse_url("tcp://broker.local");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->scheme, "tcp");
  EXPECT_EQ(t->port, kDefaultTcpPort);
}

TEST(Url, CarriesCredentials) {
  struct Case {
    const char* url;
    const char *user, *password, *token, *host;
    std::uint16_t port;
  };
  const Case cases[] = {
      // The last '@' ends them; ':' may be in the password, and an '@' left raw.
      {"rdma://alice:s3cr@t:x@10.0.0.1:9000", "alice", "s3cr@t:x", "", "10.0.0.1", 9000},
      {"tcp://tok-123@broker.local", "", "", "tok-123", "broker.local", kDefaultTcpPort},
      // RFC 3986: credentials are percent-decoded, so any character can be in them.
      {"tls://al%20ice:p%3Ass%40w%25rd@broker.local:7000", "al ice", "p:ss@w%rd", "", "broker.local", 7000},
      {"tcp://tok%2Bx%2F1@broker.local", "", "", "tok+x/1", "broker.local", kDefaultTcpPort},
  };
  for (const Case& c : cases) {
    auto u = parse_url(c.url);
    ASSERT_TRUE(u.ok()) << c.url << ": " << u.error().message;
    EXPECT_EQ(u->user, c.user) << c.url;
    EXPECT_EQ(u->password, c.password) << c.url;
    EXPECT_EQ(u->token, c.token) << c.url;
    EXPECT_EQ(u->host, c.host) << c.url;
    EXPECT_EQ(u->port, c.port) << c.url;
  }
  EXPECT_FALSE(parse_url("rdma://@host").ok());
  EXPECT_FALSE(parse_url("rdma://:pw@host").ok());
}

TEST(Url, RejectsWithAReason) {
  for (const char* bad : {"10.0.0.1:9000", "rdma://", "rdma://:7", "rdma://h:0", "rdma://h:70000",
                          "rdma://h:x", "rdma://h/x", "rdma://h?q=1", "rdma://h p", "rdma://[fe80::1"}) {
    auto u = parse_url(bad);
    ASSERT_FALSE(u.ok()) << bad;
    EXPECT_EQ(u.error().kind, ErrorKind::kInvalidArgument);
    EXPECT_NE(u.error().message.find(bad), std::string::npos);
  }
  auto c = Client::connect("carrier-pigeon://x");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("unsupported scheme"), std::string::npos);
}

}  // namespace
}  // namespace rdmabroker
