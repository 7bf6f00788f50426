// SPDX-License-Identifier: Apache-2.0
// Broker URLs through liburiparser (RFC 3986): the parser finds the parts and
// decodes percent-escapes; what is ours is which parts a broker URL may have.
#include "rdmabroker/common/url.hpp"

#include <uriparser/Uri.h>

#include <charconv>

namespace rdmabroker {
namespace {

std::string text(const UriTextRangeA& r) {
  return r.first == nullptr ? std::string()
                            : std::string(r.first, static_cast<std::size_t>(r.afterLast - r.first));
}

/// Percent-decodes `s` (no '+' to space: that is a form encoding, not RFC 3986's).
std::string unescape(std::string s) {
  const char* end = uriUnescapeInPlaceExA(s.data(), URI_FALSE, URI_BR_DONT_TOUCH);
  s.resize(static_cast<std::size_t>(end - s.data()));
  return s;
}

/// Earlier versions took an '@' in a password as it was written, the last
/// '@' ending the credentials: escape every earlier one so that such URLs
/// still parse as they did.
std::string escape_inner_at_signs(std::string_view url) {
  std::string out(url);
  const auto start = out.find("://");
  if (start == std::string::npos) return out;
  const auto authority_end = out.find_first_of("/?#", start + 3);
  const auto last_at = out.rfind('@', authority_end == std::string::npos ? std::string::npos : authority_end);
  if (last_at == std::string::npos || last_at < start + 3) return out;
  for (auto at = out.find('@', start + 3); at < last_at; at = out.find('@', at + 3))
    out.replace(at, 1, "%40");
  return out;
}

struct UriOwner {
  UriUriA uri{};
  ~UriOwner() { uriFreeUriMembersA(&uri); }
};

}  // namespace

Result<ParsedUrl> parse_url(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return Error{ErrorKind::kInvalidArgument,
                 "bad broker URL '" + std::string(url) + "': " + why +
                     " (expected rdma://host[:port], tcp://host[:port] or tls://host[:port])"};
  };
  if (url.find("://") == std::string_view::npos) return bad("no scheme");
  const std::string input = escape_inner_at_signs(url);
  UriOwner owner;
  const char* error_at = nullptr;
  if (uriParseSingleUriExA(&owner.uri, input.data(), input.data() + input.size(), &error_at) != URI_SUCCESS) {
    const auto at = error_at == nullptr ? 0 : static_cast<std::size_t>(error_at - input.data());
    if (input.find('[') != std::string::npos && input.find(']') == std::string::npos)
      return bad("unterminated [");
    return bad("not a URL at character " + std::to_string(at + 1) + " (a character that needs %-encoding?)");
  }
  const UriUriA& u = owner.uri;
  ParsedUrl out;
  out.scheme = text(u.scheme);
  if (out.scheme.empty()) return bad("no scheme");
  if (out.scheme == "tcp" || out.scheme == "tls") out.port = kDefaultTcpPort;
  if (u.query.first != nullptr || u.fragment.first != nullptr) return bad("a query or fragment");
  // A path of "/" is allowed (rdma://host/), nothing more.
  if (u.pathHead != nullptr &&
      (u.pathHead->next != nullptr || u.pathHead->text.first != u.pathHead->text.afterLast))
    return bad("a path after the host");
  if (u.userInfo.first != nullptr) {
    const std::string userinfo = text(u.userInfo);
    if (userinfo.empty()) return bad("empty credentials before '@'");
    if (const auto colon = userinfo.find(':'); colon != std::string::npos) {
      out.user = unescape(userinfo.substr(0, colon));
      out.password = unescape(userinfo.substr(colon + 1));
      if (out.user.empty()) return bad("no user name before ':'");
    } else {
      out.token = unescape(userinfo);
    }
  }
  out.host = unescape(text(u.hostText));
  if (out.host.empty()) return bad("no host");
  if (u.portText.first != nullptr) {
    const std::string port_text = text(u.portText);
    unsigned port = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (port_text.empty() || ec != std::errc{} || p != port_text.data() + port_text.size() || port == 0 ||
        port > 65535)
      return bad("bad port");
    out.port = static_cast<std::uint16_t>(port);
  }
  return out;
}

}  // namespace rdmabroker
