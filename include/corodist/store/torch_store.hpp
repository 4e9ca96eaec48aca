#pragma once
/// \file
/// corodist::store::torch_store: a client of a PyTorch TCPStore master (the
/// 1.13 or the 2.x protocol), behaving as PyTorch's own client.

#include <corodist/core/config.hpp>

#include <corodist/store/store.hpp>
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
/// and one GET/SET per key with 1.13.
class torch_store : public store {
public:
  /// Connects to the master at `opts.host:opts.port` as `connect` of
  /// tcp_store does (retries with backoff, progress logged, the same errors),
  /// with the protocol `opts.protocol` names (pytorch_1_13 or pytorch_2;
  /// native is a `usage_error`), then adds 1 to "init/".
  [[nodiscard]] static asio::awaitable<std::shared_ptr<torch_store>> connect(asio::any_io_executor ex,
                                                                             tcp_store_options opts);

  /// Blocking `connect` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<torch_store> connect_sync(asio::any_io_executor ex, tcp_store_options opts);

  ~torch_store() override;

  asio::any_io_executor get_executor() override;

  /// The master's address.
  asio::ip::tcp::endpoint remote_endpoint() const noexcept;

  /// The protocol spoken (pytorch_1_13 or pytorch_2).
  wire_protocol protocol() const noexcept;

  /// Closes the connection: the query in flight, those queued behind it and
  /// later ones throw `connection_error`. Idempotent; thread-safe (posts to
  /// the executor).
  void close();

protected:
  asio::awaitable<void> do_set(std::string key, std::string value) override;
  asio::awaitable<std::string> do_get(std::string key, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override;
  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override;
  asio::awaitable<bool> do_delete_key(std::string key) override;
  asio::awaitable<bool> do_check(std::vector<std::string> keys) override;
  asio::awaitable<void> do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_num_keys() override;
  asio::awaitable<void> do_append(std::string key, std::string value) override;
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                         std::chrono::milliseconds timeout) override;
  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override;
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) override;
  asio::awaitable<watch_stream> do_watch_key(std::string key) override;

private:
  struct impl; // src/store/torch/client.cpp
  explicit torch_store(std::unique_ptr<impl> im);
  std::unique_ptr<impl> impl_;
};

} // namespace corodist::store
