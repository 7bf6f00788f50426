#include <charconv>

#include "client_internal.hpp"

namespace rdmabroker {

Result<ParsedUrl> parse_url(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return Error{ErrorKind::kInvalidArgument,
                 "bad broker URL '" + std::string(url) + "': " + why +
                     " (expected rdma://host[:port], tcp://host[:port] or tls://host[:port])"};
  };
  ParsedUrl out;
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) return bad("no scheme");
  out.scheme = std::string(url.substr(0, sep));
  if (out.scheme == "tcp" || out.scheme == "tls") out.port = kDefaultTcpPort;
  std::string_view rest = url.substr(sep + 3);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    if (userinfo.empty()) return bad("empty credentials before '@'");
    if (const auto colon = userinfo.find(':'); colon != std::string_view::npos) {
      out.user = std::string(userinfo.substr(0, colon));
      out.password = std::string(userinfo.substr(colon + 1));
      if (out.user.empty()) return bad("no user name before ':'");
    } else {
      out.token = std::string(userinfo);
    }
  }
  if (rest.empty()) return bad("no host");
  std::string_view host = rest;
  if (rest.front() == '[') {  // [v6]:port
    const auto close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated [");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return bad("junk after ]");
    if (!rest.empty())
      rest.remove_prefix(1);
    else
      rest = {};
  } else if (const auto colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  } else {
    rest = {};
  }
  if (host.empty()) return bad("no host");
  out.host = std::string(host);
  if (!rest.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), port);
    if (ec != std::errc{} || p != rest.data() + rest.size() || port == 0 || port > 65535)
      return bad("bad port");
    out.port = static_cast<std::uint16_t>(port);
  }
  return out;
}

std::vector<std::string> split_urls(std::string_view urls) {
  std::vector<std::string> out;
  while (true) {
    const auto comma = urls.find(',');
    std::string_view one = urls.substr(0, comma);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    out.emplace_back(one);
    if (comma == std::string_view::npos) return out;
    urls.remove_prefix(comma + 1);
  }
}

Result<std::unique_ptr<Client>> Client::connect(std::string_view url, ClientOptions options) {
  if (url.find(',') != std::string_view::npos) {
    // A server list (brokers of one cluster, docs/cluster.md): every URL must
    // be valid; the first that connects serves, and a reconnecting client
    // moves to the next when its broker fails.
    const auto urls = split_urls(url);
    for (const auto& u : urls) {
      if (auto parsed = parse_url(u); !parsed) return parsed.error();
    }
    if (options.reconnect) return connect_reconnecting(url, std::move(options));
    Error last{ErrorKind::kConnectFailed, ""};
    for (const auto& u : urls) {
      auto c = connect(u, options);
      if (c) return c;
      last = c.error();
      if (last.kind == ErrorKind::kAuthenticationFailed || last.kind == ErrorKind::kInvalidArgument) break;
    }
    return Error{last.kind,
                 "no server of '" + std::string(url) + "' could be used; the last said: " + last.message};
  }
  auto parsed = parse_url(url);
  if (!parsed) return parsed.error();
  if (options.reconnect) return connect_reconnecting(url, std::move(options));
  // Credentials in the URL stand in for those of the options.
  if (!parsed->user.empty() || !parsed->token.empty()) {
    options.user = parsed->user;
    options.password = parsed->password;
    options.token = parsed->token;
  }
  if (parsed->scheme == "rdma") return connect_rdma(*parsed, std::move(options));
  if (parsed->scheme == "tcp" || parsed->scheme == "tls") return connect_tcp(*parsed, std::move(options));
  return Error{ErrorKind::kInvalidArgument, "unsupported scheme '" + parsed->scheme + "' in '" +
                                                std::string(url) + "' (rdma://, tcp:// or tls://)"};
}

}  // namespace rdmabroker
