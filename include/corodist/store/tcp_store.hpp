#pragma once
/// \file
/// corodist::store::tcp_store: the client of a store_server (c10d's TCPStore client).

#include <corodist/core/config.hpp>

#include <corodist/store/basic_store.hpp>
#include <corodist/store/tcp_store_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <memory>
#include <vector>

namespace corodist::store {

/// A client of a store_server (corodist's native protocol; for a PyTorch
/// TCPStore master see torch_store, for either connect_store). All
/// operations, from any number of coroutines and threads, share one
/// connection and are multiplexed by request id — no caller waits behind
/// another's lock. Waiting operations are timed by the server (so it drops
/// abandoned waits), with the client's own deadline a little later as a
/// backstop; a wait that lasts logs a warning after 5 s, then every 30 s,
/// naming its keys. Watch events arrive on the same connection. If the
/// connection is lost, pending and later operations throw `connection_error`.
class tcp_store : public basic_store {
public:
  /// Connects (TCP + hello + optional authentication), retrying refused or
  /// failed attempts with exponential backoff and jitter until `opts.timeout`
  /// (refused ones only for `opts.refused_retry_window` when set), logging
  /// each attempt at debug level and a warning after 5 s, then every 30 s
  /// (where it connects, the last error). Throws
  /// `timeout_error` (deadline passed; says how long it was and carries the
  /// last error), `connection_error` once the refused window has passed, or
  /// `protocol_error` at once for a peer that is not a store server or
  /// refuses the token. `opts.protocol` must be wire_protocol::native
  /// (else `usage_error`: use torch_store::connect or connect_store).
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md):
  /// ends the attempt or the pause between attempts with `operation_aborted`
  /// (`std::system_error`); no connection is left open.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<tcp_store>> connect(asio::any_io_executor ex,
                                                                           tcp_store_options opts);

  /// Blocking `connect` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<tcp_store> connect_sync(asio::any_io_executor ex, tcp_store_options opts);

  /// Closes the connection (operations still waiting throw `connection_error`;
  /// the server deletes the keys this client still owns, see `set_owned`).
  ~tcp_store() override;

  /// The server's address.
  asio::ip::tcp::endpoint remote_endpoint() const noexcept;

  /// Closes the connection: operations in flight and later ones throw
  /// `connection_error`, and the server deletes the keys this client still
  /// owns (`set_owned`). Idempotent; thread-safe (posts to the executor).
  void close();

  /// Keeps `object` alive until this store is destroyed (rank 0 of a
  /// rendezvous keeps its store_server alive through its client this way).
  /// Call before sharing the store between threads.
  void keep_until_destroyed(std::shared_ptr<void> object) { kept_.push_back(std::move(object)); }

private:
  struct impl; // src/store/client/tcp_store.cpp
  explicit tcp_store(std::shared_ptr<impl> im);

  std::vector<std::shared_ptr<void>> kept_;
};

} // namespace corodist::store
