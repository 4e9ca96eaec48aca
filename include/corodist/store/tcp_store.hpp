#pragma once
/// \file
/// corodist::store::tcp_store: the client of a store_server (c10d's TCPStore client).

#include <corodist/core/config.hpp>

#include <corodist/net/connection.hpp>
#include <corodist/store/store.hpp>
#include <corodist/store/tcp_store_options.hpp>

#include <asio/ip/tcp.hpp>

#include <memory>
#include <unordered_map>

namespace corodist::store {

namespace detail {
class wait_log;
struct tcp_call;
} // namespace detail

/// A client of a store_server (corodist's native protocol; for a PyTorch
/// TCPStore master see torch_store, for either connect_store). All
/// operations, from any number of coroutines and threads, share one
/// connection and are multiplexed by request id — no caller waits behind
/// another's lock. Waiting operations are timed by the server (so it drops
/// abandoned waits), with the client's own deadline a little later as a
/// backstop; a wait that lasts logs a warning after 5 s, then every 30 s,
/// naming its keys.
/// Watch events arrive on the same connection. If the connection is lost,
/// pending and later operations throw `connection_error`.
class tcp_store : public store {
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
  [[nodiscard]] static asio::awaitable<std::shared_ptr<tcp_store>> connect(asio::any_io_executor ex,
                                                                           tcp_store_options opts);

  /// Blocking `connect` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<tcp_store> connect_sync(asio::any_io_executor ex, tcp_store_options opts);

  ~tcp_store() override;

  asio::any_io_executor get_executor() override { return ex_; }

  /// The server's address.
  asio::ip::tcp::endpoint remote_endpoint() const noexcept { return remote_; }

  /// Closes the connection: operations in flight and later ones throw
  /// `connection_error`. Idempotent; thread-safe (posts to the executor).
  void close();

  /// Keeps `object` alive until this store is destroyed (rank 0 of a
  /// rendezvous keeps its store_server alive through its client this way).
  /// Call before sharing the store between threads.
  void keep_until_destroyed(std::shared_ptr<void> object) { kept_.push_back(std::move(object)); }

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
  friend struct detail::tcp_call; // sends a request and opens its reply
  tcp_store(asio::any_io_executor ex, std::shared_ptr<net::connection> conn, tcp_store_options opts);
  /// Starts the connection; its callbacks hold us weakly (we may be destroyed
  /// on another thread while the loop delivers them). Call once, owned by a shared_ptr.
  void start();
  void on_frame(net::message&& m);
  void on_closed(std::error_code ec);

  asio::any_io_executor ex_;
  std::shared_ptr<net::connection> conn_;
  tcp_store_options opts_;
  asio::ip::tcp::endpoint remote_;
  std::unordered_map<std::uint64_t, std::weak_ptr<detail::watch_queue>> watches_;
  std::uint64_t next_watch_ = 1;
  std::unique_ptr<detail::wait_log> waits_;
  std::vector<std::shared_ptr<void>> kept_;
};

} // namespace corodist::store
