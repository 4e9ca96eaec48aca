// TLS options from the environment, the shared OpenSSL context built from
// them, the verification-failure error category, and the TLS handshake steps
// of connect and accept (before corodist's own hello).
#include <corodist/net/tls.hpp>

#include <corodist/core/error.hpp>

#include "core/deadline.hpp"
#include "net/tls_stream.hpp"

#include <asio/ip/address.hpp>
#include <asio/ssl/error.hpp>
#include <asio/write.hpp>
#include <asio/ssl/verify_mode.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstdlib>
#include <sys/socket.h>
#include <vector>

namespace corodist::net {

namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// "0"/"false"/"no"/"off" (any case): false; anything else set: true; unset: `dflt`.
bool env_flag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0')
    return dflt;
  std::string s(v);
  for (auto& ch : s)
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}

// OpenSSL's reason for the last failure on this thread (its error queue, then cleared).
std::string openssl_reason() {
  const unsigned long e = ERR_peek_last_error();
  std::string out = e != 0 && ERR_reason_error_string(e) != nullptr ? ERR_reason_error_string(e) : "unknown error";
  ERR_clear_error();
  return out;
}

[[noreturn]] void fail(const std::string& what, const std::string& file) {
  throw corodist::usage_error("TLS: cannot load " + what + " '" + file + "': " + openssl_reason());
}

class verify_category_impl : public std::error_category {
public:
  const char* name() const noexcept override { return "corodist.tls_verify"; }
  std::string message(int v) const override {
    return std::string("certificate verify failed: ") + X509_verify_cert_error_string(v);
  }
};

using corodist::detail::use_tuple;

// The handshake's error: the certificate verification result when that is
// what failed, else OpenSSL's own error.
std::error_code handshake_error(std::error_code ec, SSL* ssl) {
  const long v = SSL_get_verify_result(ssl);
  if (v != X509_V_OK)
    return {static_cast<int>(v), tls_verify_category()};
  return ec;
}

} // namespace

const std::error_category& tls_verify_category() noexcept {
  static const verify_category_impl c;
  return c;
}

bool is_tls_error(std::error_code ec) noexcept {
  return ec.category() == tls_verify_category() || ec.category() == asio::error::get_ssl_category();
}

std::optional<tls_options> tls_options_from_env() {
  tls_options o;
  o.certificate_chain_file = env_text("CORODIST_TLS_CERT");
  o.ca_file = env_text("CORODIST_TLS_CA");
  if (!o.enabled())
    return std::nullopt;
  o.private_key_file = env_text("CORODIST_TLS_KEY");
  o.verify_peer = env_flag("CORODIST_TLS_VERIFY", true);
  o.require_client_certificate = env_flag("CORODIST_TLS_REQUIRE_CLIENT_CERT", false);
  o.server_name = env_text("CORODIST_TLS_SERVER_NAME");
  return o;
}

std::optional<tls_options> resolve_tls_options(const std::optional<tls_options>& opts) {
  auto o = opts ? opts : tls_options_from_env();
  if (o && !o->enabled())
    return std::nullopt;
  return o;
}

tls_context::tls_context(tls_options opts, std::unique_ptr<impl> i) : options_(std::move(opts)), impl_(std::move(i)) {}
tls_context::~tls_context() = default;

std::shared_ptr<const tls_context> tls_context::make(const tls_options& opts) {
  if (!opts.enabled())
    throw corodist::usage_error("TLS: the options name neither a certificate nor a CA file");
  auto i = std::make_unique<impl>();
  SSL_CTX* ctx = i->ctx.native_handle();
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(ctx, 0); // no resumption: nothing to send after the handshake
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  // AES-128-GCM first: as safe here, and faster than AES-256 (both with AES-NI).
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  if (!opts.certificate_chain_file.empty()) {
    if (opts.private_key_file.empty())
      throw corodist::usage_error("TLS: the certificate '" + opts.certificate_chain_file +
                                  "' is set without its private key file");
    if (SSL_CTX_use_certificate_chain_file(ctx, opts.certificate_chain_file.c_str()) != 1)
      fail("the certificate chain", opts.certificate_chain_file);
    if (SSL_CTX_use_PrivateKey_file(ctx, opts.private_key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      fail("the private key", opts.private_key_file);
    if (SSL_CTX_check_private_key(ctx) != 1)
      fail("the private key (key values mismatch: not the certificate's key)", opts.private_key_file);
  }
  if (!opts.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, opts.ca_file.c_str(), nullptr) != 1)
      fail("the CA file", opts.ca_file);
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    ERR_clear_error(); // no system CA store: only a configured CA verifies
  }
  return std::make_shared<const tls_context>(opts, std::move(i));
}

std::shared_ptr<const tls_context> tls_context::resolve(const std::optional<tls_options>& opts) {
  auto o = resolve_tls_options(opts);
  return o ? make(*o) : nullptr;
}

namespace detail {

asio::awaitable<std::error_code> tls_client_handshake(tls_stream& s, const tls_context& c,
                                                      const asio::ip::tcp::endpoint& peer) {
  const auto& o = c.options();
  SSL* ssl = s.stream.native_handle();
  s.stream.set_verify_mode(o.verify_peer ? asio::ssl::verify_peer : asio::ssl::verify_none);
  if (o.verify_peer) {
    std::error_code not_ip;
    const std::string name = o.server_name.empty() ? peer.address().to_string() : o.server_name;
    (void)asio::ip::make_address(name, not_ip);
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (!not_ip) {
      X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str());
    } else {
      SSL_set1_host(ssl, name.c_str());
      SSL_set_tlsext_host_name(ssl, name.c_str());
    }
  }
  auto [ec] = co_await s.stream.async_handshake(asio::ssl::stream_base::client, use_tuple);
  if (ec)
    co_return handshake_error(ec, ssl);
  co_return std::error_code{};
}

asio::awaitable<std::error_code> tls_server_handshake(tls_stream& s, const tls_context& c) {
  const auto& o = c.options();
  if (o.require_client_certificate)
    s.stream.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  else
    s.stream.set_verify_mode(o.verify_peer && !o.ca_file.empty() ? asio::ssl::verify_peer : asio::ssl::verify_none);
  SSL* ssl = s.stream.native_handle();
  auto [ec] = co_await s.stream.async_handshake(asio::ssl::stream_base::server, use_tuple);
  if (ec)
    co_return handshake_error(ec, ssl);
  co_return std::error_code{};
}

namespace {

// Bytes of records one socket operation moves (at most; a read takes what arrived).
constexpr std::size_t record_batch = std::size_t{1} << 20;
constexpr std::size_t cipher_read_size = std::size_t{1} << 20;

std::error_code last_ssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  return e != 0 ? std::error_code(static_cast<int>(e), asio::error::get_ssl_category())
                : std::error_code(asio::ssl::error::unexpected_result);
}

} // namespace

void tls_stream::start_records() {
  ssl_ = stream.native_handle();
  // What Asio's BIO pair holds of the peer's records and SSL has not read yet
  // goes first into the new input BIO (nothing is in flight the other way:
  // each of Asio's operations ends with its output written).
  BIO* pair = SSL_get_rbio(ssl_);
  in_ = BIO_new(BIO_s_mem());
  out_ = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(in_, -1); // empty: "retry" (want more), not EOF
  std::vector<char> left(BIO_ctrl_pending(pair));
  if (!left.empty()) {
    const int n = BIO_read(pair, left.data(), static_cast<int>(left.size()));
    if (n > 0)
      BIO_write(in_, left.data(), n);
  }
  SSL_set_bio(ssl_, in_, out_); // frees Asio's end of the pair; its other end goes with the engine
  cipher_in_.resize(cipher_read_size);
}

asio::awaitable<std::pair<std::error_code, std::size_t>> tls_stream::read_some(asio::mutable_buffer b) {
  std::size_t got = 0;
  auto* p = static_cast<char*>(b.data());
  for (;;) {
    while (got < b.size()) {
      const int n = SSL_read(ssl_, p + got, static_cast<int>(std::min<std::size_t>(b.size() - got, 1 << 30)));
      if (n > 0) {
        got += static_cast<std::size_t>(n);
        continue;
      }
      const int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_WANT_READ)
        break;
      if (got > 0)
        co_return std::pair{std::error_code{}, got}; // (the error comes with the next read)
      if (err == SSL_ERROR_ZERO_RETURN) // close_notify
        co_return std::pair{std::error_code(asio::error::eof), std::size_t{0}};
      co_return std::pair{last_ssl_error(), std::size_t{0}};
    }
    if (got > 0 || b.size() == 0)
      co_return std::pair{std::error_code{}, got};
    auto [ec, n] = co_await stream.next_layer().async_read_some(asio::buffer(cipher_in_), use_tuple);
    if (ec)
      co_return std::pair{ec, std::size_t{0}};
    BIO_write(in_, cipher_in_.data(), static_cast<int>(n));
  }
}

asio::awaitable<std::pair<std::error_code, std::size_t>>
tls_stream::write_all(std::span<const asio::const_buffer> buffers) {
  std::size_t total = 0;
  auto flush = [this]() -> asio::awaitable<std::error_code> {
    const std::size_t n = BIO_ctrl_pending(out_);
    if (n == 0)
      co_return std::error_code{};
    cipher_out_.resize(n);
    BIO_read(out_, cipher_out_.data(), static_cast<int>(n));
    // What the socket takes at once goes now (no trip through the loop); the rest the usual way.
    const auto sent = ::send(stream.next_layer().native_handle(), cipher_out_.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL);
    const std::size_t at = sent > 0 ? static_cast<std::size_t>(sent) : 0;
    if (at == n)
      co_return std::error_code{};
    auto [ec, w] =
        co_await asio::async_write(stream.next_layer(), asio::buffer(cipher_out_.data() + at, n - at), use_tuple);
    if (cipher_out_.capacity() > 4 * record_batch)
      std::vector<std::byte>().swap(cipher_out_);
    co_return ec;
  };
  for (const auto& b : buffers) {
    const auto* p = static_cast<const char*>(b.data());
    for (std::size_t done = 0; done < b.size();) {
      const std::size_t chunk = std::min(b.size() - done, record_batch);
      const int n = SSL_write(ssl_, p + done, static_cast<int>(chunk));
      if (n <= 0)
        co_return std::pair{last_ssl_error(), total};
      done += static_cast<std::size_t>(n);
      total += static_cast<std::size_t>(n);
      if (BIO_ctrl_pending(out_) >= record_batch) {
        const auto ec = co_await flush();
        if (ec)
          co_return std::pair{ec, total};
      }
    }
  }
  const auto ec = co_await flush();
  co_return std::pair{ec, total};
}

} // namespace detail
} // namespace corodist::net
