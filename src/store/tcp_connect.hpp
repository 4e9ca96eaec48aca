#pragma once
// How tcp_store connects (private): one retry loop with backoff and jitter,
// shared by the native and the PyTorch-protocol clients.

#include <corodist/store/tcp_store.hpp>

#include <functional>

namespace corodist::store::detail {

/// One connection attempt to a resolved address, with the time left.
using connect_attempt = std::function<asio::awaitable<std::pair<std::error_code, std::shared_ptr<tcp_store>>>(
    asio::ip::tcp::endpoint, std::chrono::milliseconds)>;

/// Resolves opts.host and calls `attempt` for each address until one succeeds,
/// retrying with exponential backoff and jitter until opts.timeout. Throws
/// timeout_error (with the last error) or, for a permanent error, at once.
asio::awaitable<std::shared_ptr<tcp_store>> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts,
                                                               const connect_attempt& attempt);

/// The PyTorch-protocol client (torch_client.cpp).
asio::awaitable<std::shared_ptr<tcp_store>> connect_torch(asio::any_io_executor ex, tcp_store_options opts);

} // namespace corodist::store::detail
