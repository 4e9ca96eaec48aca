#pragma once
/// \file
/// corodist::store::torch_store: a client of a PyTorch TCPStore master (the
/// 1.13 or the 2.x protocol), behaving as PyTorch's own client.

#include <corodist/core/config.hpp>

#include <corodist/store/basic_store.hpp>
#include <corodist/store/tcp_store_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <memory>

namespace corodist::store {

/// A client of a PyTorch TCPStore master (or of a store_server, which speaks
/// the same protocols), the sibling of tcp_store. It behaves as PyTorch's
/// client: keys get PyTorch's "/" prefix (so both see the same keys), it
/// counts itself in the master's "init/" worker counter on connect, and,
/// since the protocol has no request ids, it runs one query at a time in
/// arrival order (concurrent callers queue; none is refused). A timed-out
/// wait is cancelled with CANCEL_WAIT (2.x); 1.13 cannot cancel, so the
/// client drops that socket and reconnects on the next call. There is no
/// authentication; `list_keys` and `watch_key` throw `store_error`, and so
/// does `append` with 1.13. `multi_get`/`multi_set` are one query with 2.x
/// and one GET/SET per key with 1.13. Cancellation: see `store`; a query
/// cancelled while on the wire drops the socket (the next query reconnects),
/// one cancelled while queued behind another leaves the queue.
class torch_store : public basic_store {
public:
  /// Connects to the master at `opts.host:opts.port` as `connect` of
  /// tcp_store does (retries with backoff, progress logged, the same errors),
  /// with the protocol `opts.protocol` names (pytorch_1_13 or pytorch_2;
  /// native is a `usage_error`), then adds 1 to "init/".
  /// Cancellation: as tcp_store::connect; cancelled after the connection was
  /// made, the "init/" count may have been added to.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<torch_store>> connect(asio::any_io_executor ex,
                                                                             tcp_store_options opts);

  /// Blocking `connect` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<torch_store> connect_sync(asio::any_io_executor ex, tcp_store_options opts);

  ~torch_store() override;

  /// The master's address.
  asio::ip::tcp::endpoint remote_endpoint() const noexcept;

  /// The protocol spoken (pytorch_1_13 or pytorch_2).
  wire_protocol protocol() const noexcept;

  /// Closes the connection: the query in flight, those queued behind it and
  /// later ones throw `connection_error`. Idempotent; thread-safe (posts to
  /// the executor).
  void close();

private:
  struct impl; // src/store/client/torch_store.cpp
  explicit torch_store(std::shared_ptr<impl> im);
};

} // namespace corodist::store
