#pragma once
// What a TLS connection holds beneath its framing: OpenSSL's context (shared
// by every connection of one tls_context) and one asio::ssl stream that owns
// the connection's TCP socket; and the TLS steps of connect and accept.
#include <corodist/net/tls.hpp>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>

#include <system_error>

namespace corodist::net {

struct tls_context::impl {
  asio::ssl::context ctx{asio::ssl::context::tls};
};

namespace detail {

/// A connection's TLS stream over its (connected) TCP socket.
struct tls_stream {
  asio::ssl::stream<asio::ip::tcp::socket> stream;
  tls_stream(asio::ip::tcp::socket s, const tls_context& c) : stream(std::move(s), c.get().ctx) {}
};

/// The first byte of a TLS connection (a handshake record: the ClientHello).
constexpr unsigned char tls_handshake_record = 0x16;

/// The client's TLS handshake on `s` (connected to `peer`): SNI and the name
/// check from the options (server_name, else `peer`'s address). Returns zero,
/// a tls_verify_category() error when the server's certificate failed
/// verification (e.g. expired), or OpenSSL's error (asio::error::ssl category:
/// "tlsv1 alert unknown ca", ...).
asio::awaitable<std::error_code> tls_client_handshake(tls_stream& s, const tls_context& c,
                                                      const asio::ip::tcp::endpoint& peer);

/// The server's TLS handshake on `s` (peer verification per the options:
/// require_client_certificate). Returns zero, a tls_verify_category() error
/// for a client certificate that failed verification, or OpenSSL's error.
asio::awaitable<std::error_code> tls_server_handshake(tls_stream& s, const tls_context& c);

} // namespace detail
} // namespace corodist::net
