// SPDX-License-Identifier: Apache-2.0
// Message headers (proto/SPEC.md §3.6, docs/headers.md) as users meet them,
// over RDMA (in the guest, label rdma) and TCP (on the host, label tcp):
// headers reach every kind of subscriber as published, through fan-out,
// queue groups and request/reply, across transports; a client of protocol
// version 1 gets the messages without them and cannot send any; a broken
// header block closes only its sender; the CLI's pub -H and sub show them.
// Multicast carries them too: tests/rdma/multicast_test.cpp's streams do.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;

class HeadersTest : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
  BrokerProcess broker_{next_port()};
};

const Headers kTraced{{"Trace-Id", "4bf92f3577b34da6"},
                      {"Accept", "text/plain"},
                      {"Accept", "application/json"},
                      {"X-Empty", ""},
                      {"Note", "grüße: ünïcode, spaces and a colon"}};

TEST_P(HeadersTest, TravelThroughFanOutQueueGroupsAndRequests) {
  // Declared before the clients: destroyed after them (their I/O threads write here).
  std::mutex mu;
  std::vector<Message> grouped;
  auto pub = connect_via(broker_, GetParam());
  auto sub = connect_via(broker_, GetParam());
  ASSERT_TRUE(pub && sub);
  auto plain = sub->subscribe(std::string_view("traced.>"));
  ASSERT_TRUE(plain);
  ASSERT_TRUE(sub->queue_subscribe("traced.*", "workers", [&](const Message& m) {
    std::lock_guard l(mu);
    grouped.push_back(m);
  }));
  // A responder that answers with the request's Trace-Id and its own header.
  ASSERT_TRUE(sub->subscribe("svc.traced", [&](const Message& m) {
    Headers answer{{"Trace-Id", std::string(m.headers.get("trace-id").value_or("none"))},
                   {"Answered-By", "svc"}};
    (void)sub->publish(m.reply, answer, "pong");
  }));
  // The other transport's client, where the guest has both.
  std::unique_ptr<Client> other;
  std::shared_ptr<Subscription> other_sub;
  if (GetParam() == Via::kRdma) {
    other = connect_via(broker_, Via::kTcp);
    ASSERT_TRUE(other);
    auto s = other->subscribe(std::string_view("traced.>"));
    ASSERT_TRUE(s && other->flush(10s));
    other_sub = s.value();
  }
  ASSERT_TRUE(sub->flush(10s));

  ASSERT_TRUE(pub->publish("traced.a", kTraced, "with headers"));
  ASSERT_TRUE(pub->publish("traced.a", std::string_view("without")));
  ASSERT_TRUE(pub->publish("traced.a", Headers{{"Only", "one"}}, ""));  // headers, empty payload
  ASSERT_TRUE(pub->flush(10s));

  auto expect_stream = [](Subscription& s, const std::string& who) {
    SCOPED_TRACE(who);
    auto m1 = s.next(10s);
    ASSERT_TRUE(m1) << m1.error().message;
    EXPECT_EQ(m1->data(), "with headers");
    EXPECT_EQ(m1->headers, kTraced) << "every field, in order, repeats and empty values kept";
    EXPECT_EQ(m1->headers.get("TRACE-ID"), "4bf92f3577b34da6");
    EXPECT_EQ(m1->headers.values("accept"),
              (std::vector<std::string_view>{"text/plain", "application/json"}));
    EXPECT_EQ(m1->headers.get("X-Empty"), "");
    EXPECT_FALSE(m1->headers.get("missing"));
    auto m2 = s.next(10s);
    ASSERT_TRUE(m2) << m2.error().message;
    EXPECT_EQ(m2->data(), "without");
    EXPECT_TRUE(m2->headers.empty());
    auto m3 = s.next(10s);
    ASSERT_TRUE(m3) << m3.error().message;
    EXPECT_TRUE(m3->payload.empty());
    EXPECT_EQ(m3->headers.get("only"), "one");
  };
  expect_stream(*plain.value(), "plain subscription");
  if (other_sub) expect_stream(*other_sub, "a TCP subscriber of an RDMA publisher");
  ASSERT_TRUE(wait_until(
      [&] {
        std::lock_guard l(mu);
        return grouped.size() == 3;
      },
      10s));
  {
    std::lock_guard l(mu);
    EXPECT_EQ(grouped[0].headers, kTraced);
    EXPECT_TRUE(grouped[1].headers.empty());
  }

  // Request/reply with headers both ways.
  auto reply = pub->request("svc.traced", Headers{{"Trace-Id", "req-7"}}, as_payload("ping"), 10s);
  ASSERT_TRUE(reply) << reply.error().message;
  EXPECT_EQ(reply->data(), "pong");
  EXPECT_EQ(reply->headers, (Headers{{"Trace-Id", "req-7"}, {"Answered-By", "svc"}}));

  // The other way across transports: a TCP publisher's headers reach an RDMA subscriber.
  if (other) {
    ASSERT_TRUE(other->publish("traced.b", Headers{{"From", "tcp"}}, "x"));
    ASSERT_TRUE(other->flush(10s));
    auto m = plain.value()->next(10s);
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->headers.get("from"), "tcp");
  }

  // Bad headers are the caller's error, not the connection's.
  auto bad_name = pub->publish("traced.a", Headers{{"Bad Name", "x"}}, "x");
  ASSERT_FALSE(bad_name);
  EXPECT_EQ(bad_name.error().kind, ErrorKind::kInvalidArgument);
  auto injected = pub->publish("traced.a", Headers{{"X", "a\r\nInjected: 1"}}, "x");
  ASSERT_FALSE(injected);
  EXPECT_EQ(injected.error().kind, ErrorKind::kInvalidArgument);
  // The block counts against the payload limit.
  const std::size_t room = pub->max_payload(std::string_view("traced.a").size());
  auto too_big =
      pub->publish("traced.a", Headers{{"Big", std::string(64, 'b')}}, std::string(room - 16, 'p'));
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().kind, ErrorKind::kPayloadTooLarge) << too_big.error().message;
  ASSERT_TRUE(pub->publish("traced.a", Headers{{"Big", std::string(64, 'b')}}, std::string(room - 80, 'p')));
  ASSERT_TRUE(pub->flush(10s));
  auto fits = plain.value()->next(10s);
  ASSERT_TRUE(fits) << fits.error().message;
  EXPECT_EQ(fits->payload.size(), room - 80);
  EXPECT_EQ(broker_.stats().at("messages.headers_stripped"), 0);
}

/// The DELIVERs a raw client receives until `n` messages came (or 10 s passed).
std::vector<std::pair<proto::FrameHeader, std::string>> delivered(RawWire& w, std::size_t n) {
  std::vector<std::pair<proto::FrameHeader, std::string>> out;
  read_delivered(w, n, 10s, [&](const proto::Frame& m) {
    out.emplace_back(m.header,
                     std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
  });
  return out;
}

// §2.1 and §3.4: a client that asks for version 1 gets version 1, and every
// message, in order, without header blocks (counted); a header block it sends
// breaks a field version 1 reserves. One asking for 2 gets 2 and the blocks.
TEST_P(HeadersTest, AVersionOneClientGetsTheMessagesWithoutThem) {
  auto v1 = raw_wire(broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/0});
  auto v2 = raw_wire(broker_, GetParam(), true, proto::ConnectRequest{16384, 16, 0, /*max_version=*/2});
  ASSERT_TRUE(v1 && v2);
  EXPECT_EQ(v1->accept.version, 1);
  EXPECT_EQ(v2->accept.version, 2);
  // An operator sees each connection's version (rdmabroker stat).
  std::multiset<int> versions;
  const auto listed = nlohmann::json::parse(broker_.admin("connections"));
  for (const auto& c : listed["connections"]) versions.insert(c["version"].get<int>());
  EXPECT_EQ(versions, (std::multiset<int>{1, 2}));
  for (auto* w : {v1.get(), v2.get()}) {
    ASSERT_TRUE(w->send(frame(FrameType::kSubscribe, 5, "legacy.>")));
  }
  ASSERT_EQ(broker_.wait_stats([](auto& s) { return s["subscriptions"] == 2; }, 30s)["subscriptions"], 2);

  auto pub = connect_via(broker_, GetParam());
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->publish("legacy.a", Headers{{"Trace-Id", "t1"}}, "first"));
  ASSERT_TRUE(pub->publish("legacy.a", std::string_view("second")));
  ASSERT_TRUE(pub->publish("legacy.b", kTraced, "third"));
  ASSERT_TRUE(pub->flush(10s));

  const auto old = delivered(*v1, 3);
  ASSERT_EQ(old.size(), 3u);
  const std::vector<std::string> want = {"first", "second", "third"};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(old[i].second, want[i]);
    EXPECT_EQ(old[i].first.header_len, 0u) << "a version-1 client sees no header block";
  }
  const auto now = delivered(*v2, 3);
  ASSERT_EQ(now.size(), 3u);
  EXPECT_NE(now[0].first.header_len, 0u);
  EXPECT_EQ(now[1].first.header_len, 0u);
  EXPECT_EQ(now[2].first.header_len, proto::header_block_len(std::vector<proto::HeaderField>{
                                         {"Trace-Id", "4bf92f3577b34da6"},
                                         {"Accept", "text/plain"},
                                         {"Accept", "application/json"},
                                         {"X-Empty", ""},
                                         {"Note", "grüße: ünïcode, spaces and a colon"}}));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(now[i].second, want[i]);
  EXPECT_EQ(broker_.wait_stats([](auto& s) { return s["messages.headers_stripped"] == 2; }, 10s)
                .at("messages.headers_stripped"),
            2);

  // A header block from the version-1 client: its connection only.
  std::vector<std::byte> with_block(256);
  proto::FrameHeader h;
  h.type = FrameType::kPublish;
  const proto::HeaderField field[] = {{"A", "b"}};
  with_block.resize(proto::encode_frame(with_block, h, "legacy.a", {}, as_payload("x"), field));
  ASSERT_TRUE(v1->send(with_block));
  auto [code, text] = expect_error_then_close(*v1, 10s);
  EXPECT_EQ(code, ErrorCode::kMalformedFrame);
  EXPECT_NE(text.find("needs protocol version 2"), std::string::npos) << text;
  // The version-2 raw client sent the same bytes and is served.
  ASSERT_TRUE(v2->send(with_block));
  const auto own = delivered(*v2, 1);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].second, "x");
}

// §3.6: each broken header-block rule is MALFORMED_FRAME for its sender only.
TEST_P(HeadersTest, ABrokenHeaderBlockClosesOnlyItsSender) {
  auto good = [] {
    std::vector<std::byte> f(256);
    proto::FrameHeader h;
    h.type = FrameType::kPublish;
    const proto::HeaderField one[] = {{"Trace-Id", "abc"}};  // 15 bytes of text, 1 of padding
    f.resize(proto::encode_frame(f, h, "hb.x", {}, as_payload("data"), one));
    return f;
  };
  constexpr std::size_t kBlock = proto::kHeaderSize + 4;  // after "hb.x"
  struct Case {
    std::string what;
    std::vector<std::byte> bytes;
    std::string text;
  };
  std::vector<Case> cases;
  auto misaligned = good();
  proto::store<std::uint16_t>(misaligned.data() + 10, 12);
  cases.push_back({"header_len not a multiple of 8", misaligned, "malformed header block"});
  auto no_space = good();
  no_space[kBlock + 9] = std::byte{'_'};
  cases.push_back({"no space after the colon", no_space, "malformed header block"});
  auto dirty = good();
  dirty[kBlock + 15] = std::byte{'!'};
  cases.push_back({"padding not zero", dirty, "malformed header block"});
  auto on_subscribe = frame(FrameType::kSubscribe, 1, "hb.>");
  proto::store<std::uint16_t>(on_subscribe.data() + 10, 8);
  cases.push_back({"header_len on a SUBSCRIBE", on_subscribe, "reserved field not zero"});

  auto sub = connect_via(broker_, GetParam());
  ASSERT_TRUE(sub);
  auto s = sub->subscribe(std::string_view("hb.>"));
  ASSERT_TRUE(s && sub->flush(10s));
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto w = raw_wire(broker_, GetParam());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->send(c.bytes));
    auto [code, text] = expect_error_then_close(*w, 10s);
    EXPECT_EQ(code, ErrorCode::kMalformedFrame) << text;
    EXPECT_NE(text.find(c.text), std::string::npos) << text;
  }
  // Nothing of theirs was routed; everyone else is served.
  auto pub = connect_via(broker_, GetParam());
  ASSERT_TRUE(pub && pub->publish("hb.x", Headers{{"Fine", "yes"}}, "after"));
  ASSERT_TRUE(pub->flush(10s));
  auto m = s.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "after");
  EXPECT_EQ(m->headers.get("fine"), "yes");
}

// The CLI as a user runs it: pub -H, sub prints the headers under the
// message line, request -H.
TEST_P(HeadersTest, CliPublishesAndPrintsHeaders) {
  const std::vector<std::string> where = cli_where(broker_, GetParam());
  auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), cli_path());
    args.insert(args.end(), where.begin(), where.end());
    return args;
  };
  std::pair<int, std::string> sub;
  std::jthread t([&] { sub = run(cli({"sub", "cli.h", "--count", "2", "--timeout", "60"})); });
  ASSERT_EQ(broker_.wait_stats([](auto& s) { return s["subscriptions"] == 1; }, 30s)["subscriptions"], 1);
  EXPECT_EQ(run(cli({"pub", "cli.h", "hello", "-H", "Trace-Id=abc", "--header",
                     "Content-Type=text/plain; charset=utf-8"}))
                .first,
            0);
  EXPECT_EQ(run(cli({"pub", "cli.h", "plain"})).first, 0);
  t.join();
  EXPECT_EQ(sub.first, 0);
  EXPECT_EQ(
      sub.second,
      "[#1] cli.h: hello\n  Trace-Id: abc\n  Content-Type: text/plain; charset=utf-8\n[#2] cli.h: plain\n");
  // Usage errors: no '=' (exit 64), a name the protocol refuses (exit 1, the library's message).
  EXPECT_EQ(run(cli({"pub", "cli.h", "x", "-H", "novalue"})).first, 64);
  EXPECT_EQ(run(cli({"pub", "cli.h", "x", "-H", "bad name=1"})).first, 1);

  auto responder = connect_via(broker_, GetParam());
  ASSERT_TRUE(responder);
  ASSERT_TRUE(responder->subscribe("cli.svc", [&](const Message& m) {
    (void)responder->publish(m.reply, std::string_view(m.headers.get("question").value_or("none")));
  }));
  ASSERT_TRUE(responder->flush(10s));
  EXPECT_EQ(run(cli({"request", "cli.svc", "?", "-H", "Question=why"})),
            (std::pair<int, std::string>{0, "why\n"}));
}

INSTANTIATE_TEST_SUITE_P(Via, HeadersTest, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
