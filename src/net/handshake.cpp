// The hello exchange that opens a connection, on either side
// (connection::connect, connection::accept), with the optional token
// authentication, within the handshake deadline.
#include <corodist/net/connection.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/auth.hpp"
#include "net/endpoint_text.hpp"
#include "net/open_from.hpp"
#include "net/tls_stream.hpp"

#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <array>
#include <cstring>
#include <optional>


namespace corodist::net {

namespace {

/// The local end of `s` as text, for the debug lines of connects and accepts.
std::string local_text(const asio::ip::tcp::socket& s) {
  std::error_code ec;
  auto ep = s.local_endpoint(ec);
  return ec ? std::string("?") : detail::endpoint_text(ep);
}

using corodist::detail::use_tuple;

// Largest hello extension accepted (reserved for authentication).
constexpr std::uint32_t max_hello_extension = 64 * 1024;

// Reads the peer's hello and validates it; `extension` receives its extension block.
// (The hello steps run on a TCP socket or on a TLS stream: `Stream`.)
template <typename Stream>
asio::awaitable<std::error_code> read_hello(Stream& s, hello& out, bytes& extension) {
  std::array<std::byte, hello_size> buf;
  auto [ec, n] = co_await asio::async_read(s, asio::buffer(buf), use_tuple);
  if (ec == asio::ssl::error::stream_truncated) // a TLS peer that closed without close_notify
    ec = asio::error::eof;
  if (ec == asio::error::eof) { // closed before a byte: not a malformed hello (a client may retry it)
    if (n > 0 && static_cast<unsigned char>(buf[0]) == detail::tls_alert_record)
      co_return errc::tls_required; // a TLS-only port's answer to a plain hello (listener.cpp)
    co_return n == 0 ? std::error_code(errc::closed_before_hello) : std::error_code(errc::bad_hello);
  }
  if (ec)
    co_return ec;
  out = decode_hello(buf.data());
  if (out.magic != protocol_magic)
    co_return errc::bad_magic;
  if (out.extension_len > max_hello_extension)
    co_return errc::bad_hello;
  extension.resize(out.extension_len);
  if (out.extension_len) {
    auto [ec2, n2] = co_await asio::async_read(s, asio::buffer(extension), use_tuple);
    if (ec2)
      co_return ec2;
  }
  co_return std::error_code{};
}

template <typename Stream>
asio::awaitable<std::error_code> write_all(Stream& s, asio::const_buffer b) {
  auto [ec, n] = co_await asio::async_write(s, b, use_tuple);
  co_return ec;
}

// The client side of the hello. With a token it sends a nonce, requires the
// server to prove the token over both nonces before proving it in turn, and
// refuses a server that does not authenticate (auth_not_offered).
template <typename Stream>
asio::awaitable<std::error_code> client_hello(Stream& s, const std::string& token) {
  hello mine;
  bytes client_nonce;
  if (!token.empty()) {
    mine.flags |= hello_flags::auth;
    client_nonce = auth_nonce();
    mine.extension_len = static_cast<std::uint32_t>(client_nonce.size());
  }
  auto hb = encode(mine);
  std::array<asio::const_buffer, 2> out{asio::buffer(hb), asio::buffer(client_nonce)};
  if (auto [wec, wn] = co_await asio::async_write(s, out, use_tuple); wec)
    co_return wec;
  hello h;
  bytes ext;
  if (auto rec = co_await read_hello(s, h, ext))
    co_return rec;
  if (h.version != protocol_version)
    co_return errc::unsupported_version;
  const bool server_authenticates = (h.flags & hello_flags::auth) != 0;
  if (token.empty())
    co_return server_authenticates ? std::error_code(errc::auth_required) : std::error_code{};
  if (!server_authenticates)
    co_return errc::auth_not_offered;
  if (ext.size() != auth_nonce_size + auth_proof_size)
    co_return errc::bad_hello;
  const bytes server_nonce(ext.begin(), ext.begin() + auth_nonce_size);
  auth_proof server_proof;
  std::memcpy(server_proof.data(), ext.data() + auth_nonce_size, auth_proof_size);
  if (!check_auth_proof(token, auth_role::server, client_nonce, server_nonce, server_proof))
    co_return errc::auth_failed; // the server does not hold our token
  const auto proof = make_auth_proof(token, auth_role::client, client_nonce, server_nonce);
  if (auto wec = co_await write_all(s, asio::buffer(proof)))
    co_return wec;
  std::array<std::byte, 1> verdict{};
  auto [vec, vn] = co_await asio::async_read(s, asio::buffer(verdict), use_tuple);
  if (vec || verdict[0] != std::byte{1})
    co_return errc::auth_failed;
  co_return std::error_code{};
}

// The server side: with a token, answers the client's nonce with its own and
// its proof, then checks the client's proof.
template <typename Stream>
asio::awaitable<std::error_code> server_hello(Stream& s, const std::string& token) {
  hello h;
  bytes client_nonce;
  if (auto ec = co_await read_hello(s, h, client_nonce))
    co_return ec;
  // Answer even on a version mismatch so the client can report which we speak.
  hello mine;
  bytes ext;
  const bool client_proves = (h.flags & hello_flags::auth) && client_nonce.size() == auth_nonce_size;
  if (!token.empty() && h.version == protocol_version) {
    mine.flags |= hello_flags::auth;
    ext = auth_nonce();
    if (client_proves) {
      const auto proof = make_auth_proof(token, auth_role::server, client_nonce, ext);
      ext.insert(ext.end(), proof.begin(), proof.end());
    }
    mine.extension_len = static_cast<std::uint32_t>(ext.size());
  }
  auto hb = encode(mine);
  std::array<asio::const_buffer, 2> out{asio::buffer(hb), asio::buffer(ext)};
  auto [wec, wn] = co_await asio::async_write(s, out, use_tuple);
  if (wec)
    co_return wec;
  if (h.version != protocol_version)
    co_return errc::unsupported_version;
  if (token.empty())
    co_return std::error_code{};
  if (!client_proves)
    co_return errc::auth_failed; // a client without a token (it reports auth_required itself)
  const bytes server_nonce(ext.begin(), ext.begin() + auth_nonce_size);
  auth_proof proof;
  auto [rec, rn] = co_await asio::async_read(s, asio::buffer(proof), use_tuple);
  if (rec || !check_auth_proof(token, auth_role::client, client_nonce, server_nonce, proof))
    co_return errc::auth_failed;
  std::array<std::byte, 1> ok{std::byte{1}};
  co_return co_await write_all(s, asio::buffer(ok));
}


// The client's side from the TCP connect on: with options' tls, the TLS
// handshake (into `tls`, which then owns the socket), then the hello.
asio::awaitable<std::error_code> client_handshake(asio::ip::tcp::socket& s, std::unique_ptr<detail::tls_stream>& tls,
                                                  const asio::ip::tcp::endpoint& ep, const connection_options& opts) {
  auto [ec] = co_await s.async_connect(ep, use_tuple);
  if (ec)
    co_return ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  if (!opts.tls)
    co_return co_await client_hello(s, opts.auth_token);
  tls = std::make_unique<detail::tls_stream>(std::move(s), *opts.tls);
  const auto tec = co_await detail::tls_client_handshake(*tls, *opts.tls, ep);
  if (tec)
    co_return tec;
  co_return co_await client_hello(tls->stream, opts.auth_token);
}

// The server's side: with options' tls, the TLS handshake, then the hello.
asio::awaitable<std::error_code> server_handshake(asio::ip::tcp::socket& s, std::unique_ptr<detail::tls_stream>& tls,
                                                  const connection_options& opts) {
  if (!opts.tls)
    co_return co_await server_hello(s, opts.auth_token);
  tls = std::make_unique<detail::tls_stream>(std::move(s), *opts.tls);
  const auto tec = co_await detail::tls_server_handshake(*tls, *opts.tls);
  if (tec)
    co_return tec;
  co_return co_await server_hello(tls->stream, opts.auth_token);
}

// Runs `op` (a hello exchange), giving up with hello_timeout after `limit` (the op is cancelled).
asio::awaitable<std::error_code> within_handshake_deadline(asio::awaitable<std::error_code> op,
                                                           corodist::timeout limit) {
  auto r = co_await corodist::detail::within(
      std::move(op), limit.or_else(connection_options::default_handshake_timeout).from());
  co_return r ? *r : make_error_code(errc::hello_timeout);
}

} // namespace

asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
connection::connect(asio::any_io_executor ex, asio::ip::tcp::endpoint ep, connection_options opts) {
  asio::ip::tcp::socket s(ex);
  std::unique_ptr<detail::tls_stream> tls;
  auto ec = detail::open_from(s, ep, opts.local_address);
  if (!ec)
    ec = co_await within_handshake_deadline(client_handshake(s, tls, ep, opts), opts.handshake_timeout);
  if (ec) {
    std::error_code ignored;
    (tls ? tls->stream.next_layer() : s).close(ignored);
    if (tls)
      CORODIST_LOG_DEBUG("net: TLS connection to {} failed: {}", detail::endpoint_text(ep), ec.message());
    co_return std::pair{ec, std::shared_ptr<connection>{}};
  }
  if (tls) {
    tls->start_records();
    CORODIST_LOG_DEBUG("net: connected to {} over TLS (from {})", detail::endpoint_text(ep),
                       local_text(tls->stream.next_layer()));
    co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(tls), opts)};
  }
  CORODIST_LOG_DEBUG("net: connected to {} (from {})", detail::endpoint_text(ep), local_text(s));
  co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(s), opts)};
}

asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
connection::accept(asio::ip::tcp::socket s, connection_options opts) {
  std::error_code ec;
  s.set_option(asio::ip::tcp::no_delay(true), ec);
  std::unique_ptr<detail::tls_stream> tls;
  ec = co_await within_handshake_deadline(server_handshake(s, tls, opts), opts.handshake_timeout);
  if (ec) {
    std::error_code ignored;
    (tls ? tls->stream.next_layer() : s).close(ignored);
    co_return std::pair{ec, std::shared_ptr<connection>{}};
  }
  if (tls) {
    tls->start_records();
    CORODIST_LOG_DEBUG("net: accepted a TLS connection from {} (on {})", detail::peer_text(tls->stream.next_layer()),
                       local_text(tls->stream.next_layer()));
    co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(tls), opts)};
  }
  CORODIST_LOG_DEBUG("net: accepted a connection from {} (on {})", detail::peer_text(s), local_text(s));
  co_return std::pair{std::error_code{}, std::make_shared<connection>(std::move(s), opts)};
}

} // namespace corodist::net
