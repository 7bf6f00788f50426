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

TEST(Url, RejectsWithAReason) {
  for (const char* bad : {"10.0.0.1:9000", "rdma://", "rdma://:7", "rdma://h:0", "rdma://h:70000", "rdma://h:x"}) {
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
