#pragma once
// How store clients connect (private): one retry loop with backoff and
// jitter, shared by tcp_store and torch_store, that says what it is doing.

#include <corodist/store/tcp_store_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <system_error>

namespace corodist::store::detail {

/// One connection attempt to a resolved address within the time left; returns
/// the error, or zero once connected (the attempt keeps what it made).
using connect_attempt =
    std::function<asio::awaitable<std::error_code>(asio::ip::tcp::endpoint, corodist::deadline by)>;

/// Resolves opts.host (an IP address literal is used as it is, without the
/// resolver) and calls `attempt` for each address until one succeeds (with
/// opts.connection.local_address set: each address of its family only; none:
/// usage_error), retrying with exponential backoff (10 ms doubling to 1 s, ±25 %
/// jitter) until opts.timeout. Logs each failed attempt at debug level and
/// warnings on the `warnings()` schedule (after 5 s, then every 30 s), naming
/// host:port, `what` ("store server", "PyTorch TCPStore") and the last error.
/// Throws timeout_error at the deadline (its length, the attempts, the last
/// error), connection_error "nothing is listening on
/// HOST:PORT" once connections have been refused for opts.refused_retry_window,
/// and, at once, the error of a permanent failure (not a store server, wrong token).
/// A connection the server closes before its hello (net::errc::closed_before_hello:
/// a server at its connection limit or swamped by a connect storm) is retried.
asio::awaitable<void> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts, const char* what,
                                         const connect_attempt& attempt);

/// opts.source_address parsed and checked: nullopt for "", else the address
/// after a probe socket was bound to it (port 0, no port reserved). Throws
/// usage_error for text that is not an IP address, or an address this host
/// cannot connect from (naming the bind's error).
std::optional<asio::ip::address> source_address(asio::any_io_executor ex, const tcp_store_options& opts);


/// "host:port" of `opts` (IPv6 addresses in brackets).
std::string where(const tcp_store_options& opts);

} // namespace corodist::store::detail
