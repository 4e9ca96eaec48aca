#pragma once
/// \file
/// corodist::net::tls_options and tls_context: optional TLS 1.3 (OpenSSL,
/// through asio::ssl) under a connection's framing, with certificate
/// verification and mutual TLS. See docs/tls.md.

#include <corodist/core/config.hpp>

#include <memory>
#include <optional>
#include <string>
#include <system_error>

namespace corodist::net {

/// Where a TLS endpoint's certificate, key and trusted CA come from, and what
/// it checks of its peer. All files are PEM. An options set with neither a
/// certificate nor a CA file is "no TLS" (enabled() is false).
struct tls_options {
  /// This side's certificate chain (leaf first). Required by a server; a
  /// client sends it when set (mutual TLS).
  std::string certificate_chain_file;
  /// The private key of certificate_chain_file.
  std::string private_key_file;
  /// The CA certificate(s) a peer's certificate must chain to.
  std::string ca_file;
  /// Verify the peer's certificate (client: always the server's; server: the
  /// client's when it sends one). Default on; off is for tests only.
  bool verify_peer = true;
  /// Server: a client must present a certificate the CA signed (mutual TLS).
  bool require_client_certificate = false;
  /// Client: the name (DNS name or IP address literal) the server's certificate
  /// must carry. "": the address the client dialled (checked against the
  /// certificate's IP subject alternative names), or the host name a higher
  /// layer dialled (a store client's `host`).
  std::string server_name;

  /// Whether these options ask for TLS (a certificate or a CA file is set).
  [[nodiscard]] bool enabled() const noexcept { return !certificate_chain_file.empty() || !ca_file.empty(); }
};

/// TLS options from the environment, for processes a launcher starts
/// (corodist-run's --tls-* flags set these for its ranks):
/// CORODIST_TLS_CERT (certificate chain), CORODIST_TLS_KEY (private key),
/// CORODIST_TLS_CA (CA file), CORODIST_TLS_VERIFY ("0": do not verify the
/// peer; default "1"), CORODIST_TLS_REQUIRE_CLIENT_CERT ("1": servers require
/// mutual TLS; default "0"), CORODIST_TLS_SERVER_NAME (client: the name to
/// check). Returns nullopt when neither CORODIST_TLS_CERT nor CORODIST_TLS_CA
/// is set. Reads the environment at each call; any thread.
std::optional<tls_options> tls_options_from_env();

/// `opts` if set, else tls_options_from_env(); nullopt or !enabled(): no TLS.
/// The resolution every layer (store server and clients, RPC agent) applies
/// to its `tls` option. Any thread.
std::optional<tls_options> resolve_tls_options(const std::optional<tls_options>& opts);

/// An OpenSSL context built once from tls_options (certificate, key and CA
/// loaded, TLS 1.3 only) and shared by every connection made with the same
/// options (connection_options::tls). Immutable once made; any thread.
class tls_context {
public:
  /// Loads the files of `opts` and builds the context. Throws
  /// corodist::usage_error naming the file and OpenSSL's reason when a file
  /// cannot be loaded, the key does not match the certificate, or `opts` is
  /// not enabled().
  [[nodiscard]] static std::shared_ptr<const tls_context> make(const tls_options& opts);

  /// resolve_tls_options(opts), built with make(); null when it says no TLS.
  /// Throws as make().
  [[nodiscard]] static std::shared_ptr<const tls_context> resolve(const std::optional<tls_options>& opts);

  /// The options it was made from.
  [[nodiscard]] const tls_options& options() const noexcept { return options_; }

  /// The implementation (src/net/tls_stream.hpp): OpenSSL's context.
  struct impl;
  [[nodiscard]] impl& get() const noexcept { return *impl_; }

  tls_context(tls_options opts, std::unique_ptr<impl> i);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

private:
  tls_options options_;
  std::unique_ptr<impl> impl_;
};

/// The error category of a peer certificate that failed verification: its
/// values are OpenSSL's X509_V_ERR_* codes, and message() reads
/// "certificate verify failed: certificate has expired" (OpenSSL's reason).
const std::error_category& tls_verify_category() noexcept;

/// Whether `ec` is a TLS failure (a certificate that failed verification, or
/// OpenSSL's error: an alert from the peer, a peer that does not speak TLS):
/// retrying the same connection cannot help.
bool is_tls_error(std::error_code ec) noexcept;

} // namespace corodist::net
