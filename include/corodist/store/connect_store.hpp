#pragma once
/// \file
/// corodist::store::connect_store: a client of a store server of any protocol
/// (tcp_store for corodist's own server, torch_store for a PyTorch master).

#include <corodist/core/config.hpp>

#include <corodist/store/store.hpp>
#include <corodist/store/tcp_store_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <memory>

namespace corodist::store {

/// Connects the client `opts.protocol` calls for: `tcp_store::connect` for
/// wire_protocol::native, `torch_store::connect` for the PyTorch protocols.
/// Throws what they throw. Cancellation: as theirs.
[[nodiscard]] asio::awaitable<std::shared_ptr<store>> connect_store(asio::any_io_executor ex, tcp_store_options opts);

/// Blocking `connect_store` for plain threads (throws `usage_error` on a loop thread).
std::shared_ptr<store> connect_store_sync(asio::any_io_executor ex, tcp_store_options opts);

} // namespace corodist::store
