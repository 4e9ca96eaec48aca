#pragma once
/// \file
/// corodist::store::tcp_store_options: where a store client connects, how
/// long it tries, and which protocol its server speaks (wire_protocol).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/net/connection.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/store/default_timeout.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace corodist::store {

/// The protocol a store client speaks to its server.
enum class wire_protocol {
  native,       ///< corodist's store_server: multiplexed, authenticated, with watches (tcp_store)
  pytorch_1_13, ///< a PyTorch 1.13 TCPStore master, Debian 12's python3-torch (torch_store)
  pytorch_2,    ///< a PyTorch 2.x TCPStore master, VALIDATE + PING handshake (torch_store)
};

/// Where a store client (tcp_store, torch_store) connects and how long it tries.
struct tcp_store_options {
  /// Host name or address of the store server (IPv4 or IPv6).
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  /// Time limit of connecting (retries included), and the store's
  /// `timeout()`: of waiting operations called without one, and of every
  /// request that does not wait. `inherit()`: `default_timeout`.
  corodist::timeout timeout = default_timeout;
  /// How long connecting retries while the server refuses connections
  /// (nothing listens on host:port yet); past it, connect throws
  /// connection_error "nothing is listening on HOST:PORT". `inherit()` (the
  /// default) or `never()`: retry until `timeout`, for ranks whose server
  /// comes up later (rendezvous).
  corodist::timeout refused_retry_window = corodist::timeout::inherit();
  /// Token to authenticate with. nullopt: CORODIST_AUTH_TOKEN if set; "": none.
  /// (The PyTorch protocols have no authentication.)
  std::optional<std::string> auth_token;
  /// TLS to the store server (native protocol; docs/tls.md). nullopt: from
  /// CORODIST_TLS_* (net::tls_options_from_env()); options that are not
  /// enabled(): plain TCP. The server's certificate is checked against
  /// `server_name` if set, else `host` (a DNS name or an IP address). Ignored
  /// when connection.tls is set already.
  std::optional<net::tls_options> tls;
  /// The local address to connect from, e.g. "127.0.0.2" (an IPv4 or IPv6
  /// literal of this host, of the server's family): each source address has
  /// its own ephemeral ports, so ranks spread over 127.0.0.2, 127.0.0.3, ...
  /// can open many more than one address's ~28K loopback connections to one
  /// server. The port is still picked at connect (IP_BIND_ADDRESS_NO_PORT).
  /// "": none (the kernel picks the address). Overrides
  /// connection.local_address when set; not an address, or not one of this
  /// host: connect throws usage_error at once.
  std::string source_address;
  /// Frame and buffer limits of the connection (native protocol); with the
  /// PyTorch protocols, max_frame_size bounds a value received.
  net::connection_options connection;
  /// The server's protocol: native for tcp_store, a PyTorch one for
  /// torch_store; connect_store() picks the client from it.
  wire_protocol protocol = wire_protocol::native;
};

} // namespace corodist::store
