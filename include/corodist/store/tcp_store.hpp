#pragma once
/// \file
/// corodist::store::tcp_store: the client of a store_server (c10d's TCPStore client).

#include <corodist/net/connection.hpp>
#include <corodist/store/store.hpp>

#include <asio/ip/tcp.hpp>

#include <optional>
#include <unordered_map>

namespace corodist::store {

/// The protocol a tcp_store speaks to its server.
enum class wire_protocol {
  native,       ///< corodist's store_server: multiplexed, authenticated, with watches
  pytorch_1_13, ///< a PyTorch 1.13 TCPStore master (Debian 12's python3-torch)
  pytorch_2,    ///< a PyTorch 2.x TCPStore master (VALIDATE + PING handshake)
};

/// Where a tcp_store connects and how long it tries.
struct tcp_store_options {
  /// Host name or address of the store server (IPv4 or IPv6).
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  /// Deadline of waiting operations and of connecting (retries included).
  std::chrono::milliseconds timeout = default_timeout;
  /// Token to authenticate with. nullopt: CORODIST_AUTH_TOKEN if set; "": none.
  std::optional<std::string> auth_token;
  /// Frame and buffer limits of the connection (native protocol).
  net::connection_options connection;
  /// The server's protocol. With the PyTorch ones, the client behaves as
  /// PyTorch's TCPStore client: keys get PyTorch's "/" prefix (so both see the
  /// same keys), it counts itself in the master's "init/" worker counter, and
  /// it runs one query at a time. There is no authentication, `list_keys` and
  /// `watch_key` throw `store_error`, and so does `append` with 1.13.
  wire_protocol protocol = wire_protocol::native;
};

/// A client of a store_server. All operations, from any number of coroutines
/// and threads, share one connection and are multiplexed by request id — no
/// caller waits behind another's lock. Waiting operations are timed by the
/// server (so it drops abandoned waits), with the client's own deadline a
/// little later as a backstop. Watch events arrive on the same connection.
/// If the connection is lost, pending and later operations throw `connection_error`.
class tcp_store : public store {
public:
  /// Connects (TCP + hello + optional authentication), retrying refused or
  /// failed attempts with exponential backoff and jitter until
  /// `opts.timeout`. Throws `timeout_error` (deadline passed; carries the last
  /// error), or `protocol_error` at once for a peer that is not a store server
  /// or refuses the token. With a PyTorch `opts.protocol` the result talks to
  /// a PyTorch TCPStore master instead.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<tcp_store>> connect(asio::any_io_executor ex,
                                                                           tcp_store_options opts);

  /// Blocking `connect` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<tcp_store> connect_sync(asio::any_io_executor ex, tcp_store_options opts);

  tcp_store(asio::any_io_executor ex, std::shared_ptr<net::connection> conn, tcp_store_options opts);
  ~tcp_store() override;

  asio::any_io_executor get_executor() override { return ex_; }

  /// The server's address.
  asio::ip::tcp::endpoint remote_endpoint() const noexcept { return remote_; }

  /// Closes the connection: operations in flight and later ones throw
  /// `connection_error`. Idempotent; thread-safe (posts to the executor).
  void close();

  /// Keeps `owned` alive as long as this store (rank 0 holds its server this way).
  void hold(std::shared_ptr<void> owned) { held_.push_back(std::move(owned)); }

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

  /// For the PyTorch-protocol client, which has no native connection.
  tcp_store(asio::any_io_executor ex, tcp_store_options opts, asio::ip::tcp::endpoint remote);

  const tcp_store_options& options() const noexcept { return opts_; }

private:
  asio::awaitable<net::bytes> call(std::uint16_t op, net::bytes payload, std::optional<std::chrono::milliseconds> wait);
  void on_frame(net::message&& m);
  void on_closed(std::error_code ec);

  asio::any_io_executor ex_;
  std::shared_ptr<net::connection> conn_;
  tcp_store_options opts_;
  asio::ip::tcp::endpoint remote_;
  std::unordered_map<std::uint64_t, std::weak_ptr<detail::watch_queue>> watches_;
  std::uint64_t next_watch_ = 1;
  std::vector<std::shared_ptr<void>> held_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

} // namespace corodist::store
