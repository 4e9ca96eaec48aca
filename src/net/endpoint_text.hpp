#pragma once
// "address:port" for log lines and error messages (IPv6 addresses in brackets).
#include <asio/ip/tcp.hpp>

#include <string>

namespace corodist::net::detail {

/// "127.0.0.1:29500" or "[::1]:29500".
inline std::string endpoint_text(const asio::ip::tcp::endpoint& ep) {
  const auto a = ep.address();
  std::string out;
  if (a.is_v6())
    out.append("[").append(a.to_string()).append("]");
  else
    out = a.to_string();
  return out.append(":").append(std::to_string(ep.port()));
}

/// The peer of `s` as text, "?" when it has none.
inline std::string peer_text(const asio::ip::tcp::socket& s) {
  std::error_code ec;
  auto ep = s.remote_endpoint(ec);
  return ec ? std::string("?") : endpoint_text(ep);
}

} // namespace corodist::net::detail
