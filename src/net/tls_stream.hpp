#pragma once
// What a TLS connection holds beneath its framing: OpenSSL's context (shared
// by every connection of one tls_context) and one asio::ssl stream that owns
// the connection's TCP socket; and the TLS steps of connect and accept.
#include <corodist/net/tls.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>

#include <exception>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

namespace corodist::net {

struct tls_context::impl {
  asio::ssl::context ctx{asio::ssl::context::tls};
};

namespace detail {

/// A connection's TLS stream over its (connected) TCP socket. The handshake
/// and the hello run through Asio's ssl::stream; then start_records() moves
/// the session onto memory BIOs of its own, and the connection's reads and
/// writes go through read_some()/write_all(), which move many records per
/// socket operation (Asio's stream moves one 16 KiB record per operation
/// through a 17 KiB BIO pair: 64 MiB took 8,192 trips through the loop).
/// Loop-affine; at most one read and one write at a time (they may overlap).
struct tls_stream {
  asio::ssl::stream<asio::ip::tcp::socket> stream;
  tls_stream(asio::ip::tcp::socket s, const tls_context& c) : stream(std::move(s), c.get().ctx) {}

  /// After the hello: the session's records from now on go through read_some/write_all.
  void start_records();

  /// Reads and decrypts at least one byte into `b` (as many as are at hand,
  /// up to its size). Returns eof when the peer closed (with or without
  /// close_notify), OpenSSL's error (asio.ssl) for a bad record.
  asio::awaitable<std::pair<std::error_code, std::size_t>> read_some(asio::mutable_buffer b);

  /// Encrypts and writes all of `buffers` (the span must outlive the call),
  /// up to about 1 MiB of records per socket write.
  asio::awaitable<std::pair<std::error_code, std::size_t>> write_all(std::span<const asio::const_buffer> buffers);

  /// read_some with a completion handler: handler(ec, n) runs on the socket's executor.
  template <typename Handler>
  void async_read_some(asio::mutable_buffer b, Handler&& handler) {
    asio::co_spawn(stream.get_executor(), read_some(b),
                   [h = std::forward<Handler>(handler)](std::exception_ptr e,
                                                        std::pair<std::error_code, std::size_t> r) mutable {
                     std::move(h)(e ? std::error_code(asio::error::fault) : r.first, e ? 0 : r.second);
                   });
  }
  /// write_all with a completion handler: handler(ec, n) runs on the socket's executor.
  template <typename Handler>
  void async_write_all(std::span<const asio::const_buffer> buffers, Handler&& handler) {
    asio::co_spawn(stream.get_executor(), write_all(buffers),
                   [h = std::forward<Handler>(handler)](std::exception_ptr e,
                                                        std::pair<std::error_code, std::size_t> r) mutable {
                     std::move(h)(e ? std::error_code(asio::error::fault) : r.first, e ? 0 : r.second);
                   });
  }

private:
  SSL* ssl_ = nullptr; // the session (owned by `stream`'s engine)
  BIO* in_ = nullptr;  // ciphertext received, for SSL_read (owned by ssl_)
  BIO* out_ = nullptr; // ciphertext SSL_write made, to send (owned by ssl_)
  std::vector<std::byte> cipher_in_;  // a socket read's target
  std::vector<std::byte> cipher_out_; // the ciphertext of the socket write in flight
};

/// The first byte of a TLS connection (a handshake record: the ClientHello).
constexpr unsigned char tls_handshake_record = 0x16;
/// The first byte of a TLS alert record.
constexpr unsigned char tls_alert_record = 0x15;
/// What a TLS-only port answers a plain connection before closing it: a fatal
/// handshake_failure alert, which a corodist client reads as errc::tls_required
/// (and a TLS-unaware foreign client as a closed connection).
constexpr unsigned char tls_required_alert[] = {tls_alert_record, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28};

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
