#pragma once
/// \file
/// corodist::store::store_server: the store's master daemon (c10d's TCPStore
/// master), serving tcp_store clients on the event loop.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/net/connection.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/store/auth_token.hpp> // resolve_auth_token, once declared here

#include <asio/awaitable.hpp>
#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace corodist::store {

/// Where and how a store_server listens, and its limits. Defaults are the
/// named constants.
struct server_options {
  static constexpr std::size_t default_max_key_size = 64 * 1024;
  static constexpr std::size_t default_max_value_size = std::size_t{64} << 20;
  static constexpr std::size_t default_max_keys_per_request = 65536;
  static constexpr std::size_t default_max_pending_waits = 4096;
  static constexpr std::size_t default_max_wait_bytes_per_connection = std::size_t{16} << 20;
  static constexpr std::size_t default_max_wait_bytes = std::size_t{256} << 20;
  static constexpr std::size_t default_max_buffered_output = std::size_t{256} << 20;
  static constexpr std::size_t default_max_silent_connections = 1024;
  /// peer_timeout's default unless CORODIST_PEER_TIMEOUT_MS says otherwise.
  static constexpr std::chrono::milliseconds default_peer_timeout = net::connection_options::default_peer_timeout;

  /// Address to bind: only this interface (default loopback); "0.0.0.0" or "::" for all.
  std::string host = "127.0.0.1";
  /// Port; 0 lets the kernel choose (read it back with local_endpoint()).
  std::uint16_t port = 0;
  /// Shared secret clients must prove (HMAC challenge-response). nullopt: take
  /// CORODIST_AUTH_TOKEN from the environment if set; "": no authentication.
  std::optional<std::string> auth_token;
  /// TLS for every native client (docs/tls.md). nullopt: from CORODIST_TLS_*
  /// (net::tls_options_from_env()); options that are not enabled(): plain
  /// TCP. With TLS, the port serves TLS only: a plain client (a native one
  /// without TLS, or a PyTorch TCPStore client) is refused with one log line
  /// ("refused a plain (non-TLS) connection from ADDR: this port requires TLS").
  /// Bad files make start() throw usage_error.
  std::optional<net::tls_options> tls;
  std::size_t max_key_size = default_max_key_size;
  std::size_t max_value_size = default_max_value_size;
  std::size_t max_keys_per_request = default_max_keys_per_request;
  /// Waiting operations (get/wait/multi_get) one connection may have pending.
  std::size_t max_pending_waits = default_max_pending_waits;
  /// Memory the pending waits of one connection may hold (their keys, counted
  /// with the server's index of them); a wait over it fails with store_error.
  std::size_t max_wait_bytes_per_connection = default_max_wait_bytes_per_connection;
  /// Memory the pending waits of all connections together may hold.
  std::size_t max_wait_bytes = default_max_wait_bytes;
  /// Unsent output per connection before a client that does not read is dropped.
  std::size_t max_buffered_output = default_max_buffered_output;
  /// Connections served at once (handshakes included); more are refused at
  /// once, with one warning per episode. 0: the process's open-file limit
  /// (RLIMIT_NOFILE) less 64 descriptors of headroom.
  std::size_t max_connections = 0;
  /// PyTorch clients open a second connection that never sends a byte (1.13);
  /// at most this many silent connections are kept, further ones are closed
  /// with a warning. Only with torch_protocol.
  std::size_t max_silent_connections = default_max_silent_connections;
  /// A native client that sends nothing, not even a heartbeat, for this long
  /// is dropped (net::connection_options::peer_timeout; its waits go with it).
  /// `never()`: never. Default: CORODIST_PEER_TIMEOUT_MS if set, else 10 s.
  /// PyTorch clients have no heartbeat and are not subject to it.
  corodist::timeout peer_timeout = net::configured_peer_timeout();
  /// Time limit of each client's hello (and authentication).
  corodist::timeout handshake_timeout = net::connection_options::default_handshake_timeout;
  /// Also serve PyTorch TCPStore clients (the 1.13 and the 2.x protocol) on
  /// the same port, recognised by a connection's first byte. They share the
  /// keys with native clients (PyTorch's client adds a "/" before its keys).
  /// They cannot authenticate: with an auth token set, they are refused.
  bool torch_protocol = true;
};

/// The store server. Its state lives on one executor (an event loop): single
/// threaded, with waiters and watchers per key. A client that disconnects has
/// its waits and watches removed; one that sends garbage, oversized frames or
/// unknown operations gets an error or is dropped with a log line, without
/// touching the data or the other clients.
class store_server : public std::enable_shared_from_this<store_server> {
public:
  /// Binds `opts.host:opts.port` and starts serving on `ex`. Throws
  /// `connection_error` if the address cannot be bound. Call from any thread.
  static std::shared_ptr<store_server> start(asio::any_io_executor ex, server_options opts);

  store_server(asio::any_io_executor ex, server_options opts);
  ~store_server();

  /// The bound address (with the real port when started with port 0).
  asio::ip::tcp::endpoint local_endpoint() const noexcept { return endpoint_; }

  /// Stops accepting and closes every client connection; the data stays.
  /// Thread-safe (posts to the executor).
  void stop();

  /// Connected clients (call on the executor).
  std::size_t connection_count() const noexcept;

  /// Completes with true once at most `at_most` clients are connected, or with
  /// false when `limit` has passed first. Run on the executor.
  /// Cancellation: terminal, partial and total (`operation_aborted`); nothing
  /// of the server's changes.
  [[nodiscard]] asio::awaitable<bool> clients_left(std::size_t at_most, corodist::timeout limit);

  /// Completes with true once `condition()` holds, or with false when `limit`
  /// has passed first. `condition` runs on the executor, now and after every
  /// change of the connected clients or of the pending waits (one
  /// registered, completed, timed out or dropped), so that it can look at
  /// connection_count(), pending_waits() and pending_wait_bytes() without
  /// polling. Run on the executor; the server must outlive the wait.
  /// Cancellation: as clients_left.
  [[nodiscard]] asio::awaitable<bool> wait_until(std::function<bool()> condition, corodist::timeout limit);

  /// Number of keys stored (call on the executor).
  std::size_t key_count() const noexcept;

  /// Waiting operations pending, of every client (call on the executor).
  std::size_t pending_waits() const noexcept;

  /// Bytes held by pending waits, as counted against the wait limits (call on the executor).
  std::size_t pending_wait_bytes() const noexcept;

private:
  struct impl;
  std::shared_ptr<impl> impl_;
  asio::ip::tcp::endpoint endpoint_;
};

} // namespace corodist::store
