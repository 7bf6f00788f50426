// SPDX-License-Identifier: Apache-2.0
// proto/SPEC.md's rules as a client written from the spec alone meets them,
// over RDMA (in the guest, label rdma) and TCP (on the host, label tcp): each
// broken rule gets its own error code, the ERROR then CLOSE the spec
// promises, and the connection's end; a connect request no retry can fix is
// refused as such; frames sent right after CONNECT wait for its verdict.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "harness.hpp"
#include "rdmabroker/client.hpp"

namespace rdmabroker::test {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;
using proto::FrameType;

std::vector<std::byte> concat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<std::byte> connect_frame(std::string_view user, std::string_view password) {
  return frame(FrameType::kConnect, static_cast<std::uint32_t>(user.size()), "",
               std::string(user) + std::string(password));
}

/// Reads until a PONG arrives; the other frames seen on the way.
bool pong_arrives(RawWire& w, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& bytes : w.receive(100ms)) {
      proto::Frame f;
      if (proto::decode_frame(bytes, bytes.size(), f) != proto::DecodeStatus::kOk) return false;
      if (f.header.type == FrameType::kPong) return true;
      if (f.header.type == FrameType::kError || f.header.type == FrameType::kClose) {
        ADD_FAILURE() << proto::to_string(f.header.type) << " "
                      << proto::to_string(static_cast<ErrorCode>(f.header.arg)) << ": "
                      << std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
        return false;
      }
    }
  }
  return false;
}

class Spec : public ::testing::TestWithParam<Via> {
 protected:
  void SetUp() override {
    if (GetParam() == Via::kRdma) require_rdma();
  }
};

// One case per rule of §3 a client can break; each closes only that client,
// with the code §3.5 names and a text that says which rule.
TEST_P(Spec, EveryBrokenFrameRuleGetsItsErrorThenClose) {
  BrokerProcess broker(next_port());
  struct Case {
    std::string what;
    std::vector<std::byte> bytes;
    ErrorCode code;
    std::string text;
  };
  std::vector<Case> cases;
  auto bad_magic = frame(FrameType::kPing, 0, "");
  bad_magic[0] = std::byte{0x99};
  cases.push_back({"bad magic", bad_magic, ErrorCode::kMalformedFrame, "bad frame magic"});
  auto bad_type = frame(FrameType::kPing, 0, "");
  bad_type[3] = std::byte{99};
  cases.push_back({"unknown type", bad_type, ErrorCode::kMalformedFrame, "unknown frame type"});
  cases.push_back({"empty subject", frame(FrameType::kPublish, 0, "", "x"), ErrorCode::kInvalidSubject,
                   "invalid subject"});
  auto long_subject = frame(FrameType::kPublish, 0, std::string(255, 's'), "x");
  proto::store<std::uint16_t>(long_subject.data() + 6, 256);  // the payload's byte becomes the 256th
  proto::store<std::uint32_t>(long_subject.data() + 12, 0);
  cases.push_back({"256-byte subject", long_subject, ErrorCode::kInvalidSubject, "1 to 255 bytes"});
  auto request_without_reply = frame(FrameType::kPublish, 0, "svc.a", "x");
  proto::store<std::uint16_t>(request_without_reply.data() + 4, proto::kFlagRequest);
  cases.push_back({"REQUEST without a reply subject", request_without_reply, ErrorCode::kMalformedFrame,
                   "REQUEST needs a PUBLISH with a reply subject"});
  auto fragment_subscribe = frame(FrameType::kSubscribe, 1, "a.b");
  proto::store<std::uint16_t>(fragment_subscribe.data() + 4, proto::kFlagFragment);
  cases.push_back(
      {"FRAGMENT on a SUBSCRIBE", fragment_subscribe, ErrorCode::kMalformedFrame, "FRAGMENT a PUBLISH"});
  cases.push_back({"PUBLISH with arg 7", frame(FrameType::kPublish, 7, "a.b", "x"),
                   ErrorCode::kMalformedFrame, "arg not zero"});
  auto dirty_padding = frame(FrameType::kPublish, 0, "a.b", "hi");  // 37 bytes, three of padding
  dirty_padding.back() = std::byte{'!'};
  cases.push_back({"padding not zero", dirty_padding, ErrorCode::kMalformedFrame, "padding"});
  cases.push_back({"a PONG from the client", frame(FrameType::kPong, 0, ""), ErrorCode::kProtocolViolation,
                   "sent by the broker, never to it"});
  cases.push_back(
      {"CONNECT twice", connect_frame("", ""), ErrorCode::kProtocolViolation, "CONNECT sent twice"});

  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto w = raw_wire(broker, GetParam());
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->send(c.bytes));
    auto [code, text] = expect_error_then_close(*w, 10s);
    EXPECT_EQ(code, c.code) << text;
    EXPECT_NE(text.find(c.text), std::string::npos) << text;
  }
  auto s = broker.wait_stats(
      [&](auto& s) {
        return s["connections.closed.protocol_error"] == static_cast<std::int64_t>(cases.size());
      },
      10s);
  EXPECT_EQ(s["connections.closed.protocol_error"], static_cast<std::int64_t>(cases.size()));
  // Everyone else is served.
  auto sub = connect_via(broker, GetParam());
  auto pub = connect_via(broker, GetParam());
  ASSERT_TRUE(sub && pub);
  auto q = sub->subscribe(std::string_view("spec.after"));
  ASSERT_TRUE(q && sub->flush(10s));
  ASSERT_TRUE(pub->publish("spec.after", std::string_view("fine")));
  auto m = q.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "fine");
}

// Issue 49: where the spec and the broker disagreed, the rule as the spec
// now words it, as a client written from it meets it.
TEST_P(Spec, TheRulesAsWrittenAreTheBrokers) {
  BrokerProcess broker(next_port());
  auto sub = connect_via(broker, GetParam());
  ASSERT_TRUE(sub);
  auto q = sub->subscribe(std::string_view("spec.rules"));
  ASSERT_TRUE(q && sub->flush(10s));
  auto w = raw_wire(broker, GetParam());
  ASSERT_TRUE(w);
  const std::uint64_t id = w->accept.connection_id;
  const auto bytes_of = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  const auto encode = [](proto::FrameHeader h, std::string_view subject, std::span<const std::byte> payload,
                         std::span<const proto::HeaderField> headers) {
    std::vector<std::byte> out(1024);
    out.resize(proto::encode_frame(out, h, subject, "", payload, headers));
    return out;
  };

  // §3.6: a header value is any bytes but NUL, CR and LF; the broker does not
  // check that they are UTF-8, and delivers them as sent.
  const std::string raw_value = "\xff\xfe caf\xc3";
  const proto::HeaderField field{"X-Bytes", raw_value};
  proto::FrameHeader publish;
  publish.type = FrameType::kPublish;
  ASSERT_TRUE(w->send(encode(publish, "spec.rules", bytes_of("body"), std::span(&field, 1))));
  auto m = q.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "body");
  EXPECT_EQ(MessageView(*m).header("X-Bytes"), std::optional<std::string_view>(raw_value));

  // §3.7: a first fragment's payload may be its header block alone.
  const std::size_t block = proto::header_block_len(std::span(&field, 1));
  const auto length = static_cast<std::uint32_t>(block + 4);
  ASSERT_TRUE(
      w->send(encode(proto::FrameHeader::fragment(length, 0, id), "spec.rules", {}, std::span(&field, 1))));
  ASSERT_TRUE(w->send(encode(proto::FrameHeader::fragment(length, static_cast<std::uint32_t>(block), id), "",
                             bytes_of("tail"), {})));
  m = q.value()->next(10s);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->data(), "tail");
  EXPECT_EQ(MessageView(*m).header("X-Bytes"), std::optional<std::string_view>(raw_value));

  // §3.1, §3.3: a client's ABORT carries any sequence (ignored); the message is abandoned, the connection
  // stays.
  ASSERT_TRUE(
      w->send(encode(proto::FrameHeader::fragment(100, 0, id), "spec.rules", bytes_of("12345678"), {})));
  auto abort = frame(FrameType::kAbort, 0, "");
  proto::store<std::uint64_t>(abort.data() + 24, 0xdeadbeef);
  ASSERT_TRUE(w->send(abort));
  ASSERT_TRUE(w->send(frame(FrameType::kPing, 0, "")));
  EXPECT_TRUE(pong_arrives(*w, 10s));
  auto s = broker.wait_stats([](auto& s) { return s["messages.dropped.incomplete"] == 1; }, 10s);
  EXPECT_EQ(s["messages.dropped.incomplete"], 1);
  EXPECT_TRUE(wait_until([&] { return sub->stats().aborted_messages == 1; }, 10s));
}

// §2.3: a field out of range that no retry fixes is INVALID_REQUEST, never
// BUFFER_TOO_SMALL (a client following that reason would retry for ever);
// a small buffer is BUFFER_TOO_SMALL with the size to retry with.
TEST_P(Spec, ConnectRequestsOutOfRangeAreRefusedForGood) {
  BrokerProcess broker(next_port());
  for (std::uint32_t credits : {0u, 1u, 65536u}) {
    for (std::uint32_t size : {16384u, 512u}) {
      SCOPED_TRACE("initial_credits " + std::to_string(credits) + ", buffers of " + std::to_string(size));
      auto reject = raw_reject(broker, GetParam(), proto::encode(proto::ConnectRequest{size, credits}));
      ASSERT_TRUE(reject);
      EXPECT_EQ(reject->reason, proto::RejectReason::kInvalidRequest);
    }
  }
  auto huge =
      raw_reject(broker, GetParam(), proto::encode(proto::ConnectRequest{proto::kMaxBufferSize + 1, 16}));
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->reason, proto::RejectReason::kInvalidRequest);
  auto small = raw_reject(broker, GetParam(), proto::encode(proto::ConnectRequest{512, 16}));
  ASSERT_TRUE(small);
  EXPECT_EQ(small->reason, proto::RejectReason::kBufferTooSmall);
  EXPECT_EQ(small->required_buffer_size, 16384u);
  // Following it works.
  EXPECT_FALSE(
      raw_reject(broker, GetParam(), proto::encode(proto::ConnectRequest{small->required_buffer_size, 16})));
  // The library says why, and does not retry (over TCP it sends no credits
  // of its own: TCP's window is its flow control, §1.2).
  if (GetParam() == Via::kRdma) {
    ClientOptions opt;
    opt.recv_credits = 1;
    auto c = Client::connect(url_via(broker, GetParam()), opt);
    ASSERT_FALSE(c);
    EXPECT_NE(c.error().message.find("out of range"), std::string::npos) << c.error().message;
  }
}

// §2.4: what a client sends right after CONNECT, before the PONG that says
// "authenticated", waits for the verdict: taken in order if the credentials
// are good (with a password as without), dropped with the connection if not.
TEST_P(Spec, FramesRightAfterConnectWaitForTheVerdict) {
  const std::string config = "/tmp/rdmabroker-spec-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(config) << "auth:\n  anonymous: true\n  users:\n    - name: alice\n      password: '"
                        << hash_secret("alice-pw") << "'\n";
  BrokerProcess broker(next_port(), {"--config", config}, /*allow_anonymous=*/true);
  auto subscribe_then_ping = [](std::uint32_t sid, std::string_view subject) {
    return concat({frame(FrameType::kSubscribe, sid, subject), frame(FrameType::kPing, 0, "")});
  };
  // A password (checked on the authenticator thread) and anonymous (decided at once): the same rule.
  std::vector<std::unique_ptr<RawWire>> accepted;
  for (const auto& [user, password] : {std::pair{"alice", "alice-pw"}, std::pair{"", ""}}) {
    SCOPED_TRACE(std::string("user '") + user + "'");
    accepted.push_back(raw_wire(broker, GetParam(), /*anonymous=*/false));
    RawWire* w = accepted.back().get();
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->send(concat({connect_frame(user, password), subscribe_then_ping(1, "spec.held")})));
    EXPECT_TRUE(pong_arrives(*w, 10s));
  }
  EXPECT_EQ(broker.stats()["subscriptions"], 2);

  // Refused: nothing that followed CONNECT took effect.
  auto w = raw_wire(broker, GetParam(), /*anonymous=*/false);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->send(concat({connect_frame("alice", "wrong"), subscribe_then_ping(1, "spec.refused")})));
  auto [code, text] = expect_error_then_close(*w, 10s);
  EXPECT_EQ(code, ErrorCode::kAuthenticationFailed) << text;
  auto s = broker.wait_stats([](auto& s) { return s["connections.closed.auth_failed"] == 1; }, 10s);
  EXPECT_EQ(s["connections.closed.auth_failed"], 1);
  EXPECT_EQ(s["subscriptions"], 2);
  ::unlink(config.c_str());
}

INSTANTIATE_TEST_SUITE_P(Via, Spec, ::testing::Values(Via::kRdma, Via::kTcp),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace rdmabroker::test
