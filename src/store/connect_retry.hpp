#pragma once
// How store clients connect (private): one retry loop with backoff and
// jitter, shared by tcp_store and torch_store, that says what it is doing.

#include <corodist/store/tcp_store_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <system_error>

namespace corodist::store::detail {

/// One connection attempt to a resolved address within the time left; returns
/// the error, or zero once connected (the attempt keeps what it made).
using connect_attempt =
    std::function<asio::awaitable<std::error_code>(asio::ip::tcp::endpoint, std::chrono::milliseconds left)>;

/// Resolves opts.host and calls `attempt` for each address until one
/// succeeds, retrying with exponential backoff (10 ms doubling to 1 s, ±25 %
/// jitter) until opts.timeout. Logs each failed attempt at debug level and
/// warnings on the `warnings()` schedule (after 5 s, then every 30 s), naming
/// host:port, `what` ("store server", "PyTorch TCPStore") and the last error.
/// Throws timeout_error at the deadline (its length, the attempts, the last
/// error), connection_error "nothing is listening on
/// HOST:PORT" once connections have been refused for opts.refused_retry_window,
/// and, at once, the error of a permanent failure (not a store server, wrong token).
asio::awaitable<void> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts, const char* what,
                                         const connect_attempt& attempt);

/// "host:port" of `opts` (IPv6 addresses in brackets).
std::string where(const tcp_store_options& opts);

} // namespace corodist::store::detail
