// tcp_store's PyTorch compatibility mode: a client of a PyTorch TCPStore
// master (the 1.13 or the 2.x protocol), behaving as PyTorch's own client.

#include <corodist/core/detail/io_registration.hpp>
#include <corodist/core/error.hpp>
#include <corodist/net/errors.hpp>
#include <corodist/store/tcp_store.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "store/kv_state.hpp"
#include "store/tcp_connect.hpp"
#include "store/torch_wire.hpp"

#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <deque>
#include <system_error>
#include <tuple>
#include <random>

namespace corodist::store::detail {

namespace {

using torch::query;
using torch::version;
using ms = std::chrono::milliseconds;

using corodist::detail::use_tuple;
// PyTorch's client puts this before every user key; its worker counter key has none.
constexpr std::string_view key_prefix = "/";
constexpr std::string_view init_key = "init/";

std::string where(const asio::ip::tcp::endpoint& ep) { return net::detail::endpoint_text(ep); }

/// Awaits a socket transfer within `deadline` (zero: no deadline); the transfer is
/// cancelled when the deadline passes, which gives asio::error::timed_out.
asio::awaitable<std::error_code> with_deadline(asio::awaitable<std::tuple<std::error_code, std::size_t>> op,
                                               ms deadline) {
  if (deadline.count() <= 0) {
    auto [ec, n] = co_await std::move(op);
    co_return ec;
  }
  auto r = co_await corodist::detail::within(std::move(op), deadline);
  if (!r)
    co_return asio::error::timed_out;
  co_return std::get<0>(*r);
}

asio::awaitable<std::error_code> write_all(asio::ip::tcp::socket& s, const std::string& bytes, ms deadline) {
  co_return co_await with_deadline(asio::async_write(s, asio::buffer(bytes), use_tuple), deadline);
}

asio::awaitable<std::error_code> read_exact(asio::ip::tcp::socket& s, void* p, std::size_t n, ms deadline) {
  co_return co_await with_deadline(asio::async_read(s, asio::buffer(p, n), use_tuple), deadline);
}

/// TCP connect plus, for 2.x, the VALIDATE + PING exchange, within `deadline`.
asio::awaitable<std::error_code> open_socket(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep, version v,
                                             ms deadline) {
  auto r = co_await corodist::detail::within(s.async_connect(ep, use_tuple), deadline);
  if (!r)
    co_return net::errc::hello_timeout;
  if (auto [ec] = *r; ec)
    co_return ec;
  std::error_code ignored;
  s.set_option(asio::ip::tcp::no_delay(true), ignored);
  if (v == version::v1)
    co_return std::error_code{};
  thread_local std::mt19937 rng(std::random_device{}());
  const std::uint32_t nonce = rng();
  std::string hello;
  torch::encoder(hello)
      .u8(torch::encode_query(v, query::validate))
      .u32(torch::validate_magic)
      .u8(torch::encode_query(v, query::ping))
      .u32(nonce);
  if (auto ec = co_await write_all(s, hello, deadline))
    co_return ec;
  std::uint32_t echo = 0;
  if (auto ec = co_await read_exact(s, &echo, sizeof echo, deadline))
    co_return ec == asio::error::timed_out ? std::error_code(net::errc::hello_timeout) : ec;
  if (echo != nonce)
    co_return net::errc::bad_magic; // not a PyTorch 2.x TCPStore
  co_return std::error_code{};
}

class torch_client final : public tcp_store {
public:
  torch_client(asio::any_io_executor ex, tcp_store_options opts, asio::ip::tcp::endpoint remote,
               asio::ip::tcp::socket socket, version v)
      : tcp_store(ex, std::move(opts), remote), version_(v),
        socket_(std::make_shared<asio::ip::tcp::socket>(std::move(socket))),
        // Ends a transfer still in flight (whose frame keeps us alive) and every queued
        // caller before the context's services go (Asio issue 1235).
        registration_(get_executor(), [this](bool) {
          closed_ = true;
          drop();
          for (auto& t : queue_)
            t->timer.cancel();
        }) {}

  ~torch_client() override {
    if (socket_)
      asio::post(get_executor(), [s = socket_] {
        std::error_code ignored;
        s->close(ignored);
      });
  }

  /// Counts this client in the master's worker counter, as PyTorch's clients do.
  asio::awaitable<void> register_worker() { co_await add_full_key(std::string(init_key), 1); }

protected:
  asio::awaitable<void> do_set(std::string key, std::string value) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::set)).bytes(prefixed(key)).bytes(value);
    co_await send(q);
  }

  asio::awaitable<std::string> do_get(std::string key, ms timeout) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::vector<std::string> keys{prefixed(key)};
    co_await wait_locked(keys, timeout); // PyTorch's client: WAIT, then GET
    std::string q;
    torch::encoder(q).u8(code(query::get)).bytes(keys[0]);
    co_await send(q);
    co_return co_await recv_bytes();
  }

  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    co_return co_await add_full_key(prefixed(key), delta);
  }

  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::compare_set)).bytes(prefixed(key)).bytes(expected).bytes(desired);
    co_await send(q);
    co_return co_await recv_bytes();
  }

  asio::awaitable<bool> do_delete_key(std::string key) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::delete_key)).bytes(prefixed(key));
    co_await send(q);
    co_return co_await recv_i64(options().timeout) != 0;
  }

  asio::awaitable<bool> do_check(std::vector<std::string> keys) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::check)).keys(prefixed(keys));
    co_await send(q);
    co_return co_await recv_u8(options().timeout) == torch::check_ready;
  }

  asio::awaitable<void> do_wait(std::vector<std::string> keys, ms timeout) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    co_await wait_locked(prefixed(keys), timeout);
  }

  asio::awaitable<std::int64_t> do_num_keys() override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::num_keys));
    co_await send(q);
    co_return co_await recv_i64(options().timeout);
  }

  asio::awaitable<void> do_append(std::string key, std::string value) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::append)).bytes(prefixed(key)).bytes(value); // 1.13: store_error
    co_await send(q);
  }

  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys, ms timeout) override {
    auto self = shared_from_this();
    auto guard = co_await lock();
    auto full = prefixed(keys);
    co_await wait_locked(full, timeout);
    std::vector<std::string> values;
    if (version_ == version::v2) {
      std::string q;
      torch::encoder(q).u8(code(query::multi_get)).keys(full);
      co_await send(q);
      for (std::size_t i = 0; i < full.size(); ++i)
        values.push_back(co_await recv_bytes());
    } else { // 1.13 has no MULTI_GET
      for (auto& k : full) {
        std::string q;
        torch::encoder(q).u8(code(query::get)).bytes(k);
        co_await send(q);
        values.push_back(co_await recv_bytes());
      }
    }
    co_return values;
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override {
    check_multi_set(keys, values);
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder e(q);
    if (version_ == version::v2) {
      e.u8(code(query::multi_set)).u64(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i)
        e.bytes(prefixed(keys[i])).bytes(values[i]);
    } else { // 1.13 has no MULTI_SET: one SET each, written together
      for (std::size_t i = 0; i < keys.size(); ++i)
        e.u8(code(query::set)).bytes(prefixed(keys[i])).bytes(values[i]);
    }
    co_await send(q);
  }

  asio::awaitable<std::vector<std::string>> do_list_keys(std::string) override {
    throw store_error("list_keys is not in the PyTorch TCPStore protocol");
    co_return std::vector<std::string>{};
  }

  asio::awaitable<watch_stream> do_watch_key(std::string) override {
    throw store_error("watch_key is not supported with the PyTorch TCPStore protocol");
    co_return watch_stream{};
  }

private:
  /// ADD on `key` as sent (user keys are prefixed by the caller; "init/" is not).
  asio::awaitable<std::int64_t> add_full_key(std::string key, std::int64_t delta) {
    auto self = shared_from_this();
    auto guard = co_await lock();
    std::string q;
    torch::encoder(q).u8(code(query::add)).bytes(key).i64(delta);
    co_await send(q);
    co_return co_await recv_i64(options().timeout);
  }

  /// Held while one query and its response use the socket; PyTorch's protocol
  /// has no request ids, so queries run one at a time, in arrival order.
  class guard {
  public:
    explicit guard(torch_client* c) : c_(c) {}
    guard(guard&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    guard& operator=(guard&&) = delete;
    ~guard() {
      if (c_)
        c_->release();
    }

  private:
    torch_client* c_;
  };

  asio::awaitable<guard> lock() {
    if (busy_) {
      auto t = std::make_shared<turn>(get_executor());
      queue_.push_back(t);
      co_await t->timer.async_wait(use_tuple); // release() grants and cancels it
      if (closed_) {
        queue_.erase(std::remove(queue_.begin(), queue_.end(), t), queue_.end());
        throw_closed();
      }
      if (!t->granted) { // the caller was cancelled while queued: leave the line
        queue_.erase(std::remove(queue_.begin(), queue_.end(), t), queue_.end());
        throw std::system_error(asio::error::operation_aborted, "store: PyTorch-protocol query");
      }
      co_return guard(this); // busy_ stayed set: the lock was handed over
    }
    busy_ = true;
    co_return guard(this);
  }

  void release() {
    if (queue_.empty()) {
      busy_ = false;
      return;
    }
    auto next = std::move(queue_.front()); // the lock passes straight to the next in line
    queue_.pop_front();
    next->granted = true;
    next->timer.cancel();
  }

  std::uint8_t code(query q) const { return torch::encode_query(version_, q); }

  static std::string prefixed(const std::string& k) { return std::string(key_prefix) + k; }
  static std::vector<std::string> prefixed(const std::vector<std::string>& ks) {
    std::vector<std::string> out;
    out.reserve(ks.size());
    for (auto& k : ks)
      out.push_back(prefixed(k));
    return out;
  }

  /// WAITs for `keys` (already prefixed); the lock is held.
  asio::awaitable<void> wait_locked(const std::vector<std::string>& keys, ms timeout) {
    std::string q;
    torch::encoder(q).u8(code(query::wait)).keys(keys);
    co_await send(q);
    std::uint8_t r = 0;
    auto ec = co_await read_exact(*socket_, &r, 1, timeout);
    if (!ec && r == torch::wait_stop_waiting)
      co_return;
    if (!ec) {
      drop();
      throw protocol_error("store: PyTorch TCPStore at " + where(remote_endpoint()) + " answered WAIT with " +
                           std::to_string(r));
    }
    if (ec != asio::error::timed_out)
      fail(ec, "wait");
    auto message = timeout_message(keys, timeout);
    if (version_ == version::v1) {
      // 1.13 cannot cancel a wait: its answer would arrive later, out of turn.
      drop();
      throw timeout_error(message);
    }
    std::string cancel;
    torch::encoder(cancel).u8(code(query::cancel_wait));
    co_await send(cancel);
    // The wait may have ended just before the cancel: STOP_WAITING, then WAIT_CANCELED.
    auto first = co_await recv_u8(options().timeout);
    if (first == torch::wait_stop_waiting) {
      co_await recv_u8(options().timeout);
      co_return;
    }
    throw timeout_error(message);
  }

  asio::awaitable<void> send(const std::string& q) {
    if (closed_)
      throw_closed();
    if (!socket_) { // lost, or given up after a 1.13 wait timed out: connect again
      asio::ip::tcp::socket s(get_executor());
      if (auto ec = co_await open_socket(s, remote_endpoint(), version_, options().timeout))
        throw connection_error("store: reconnecting to PyTorch TCPStore at " + where(remote_endpoint()) + ": " +
                               ec.message());
      socket_ = std::make_shared<asio::ip::tcp::socket>(std::move(s));
    }
    if (auto ec = co_await write_all(*socket_, q, options().timeout))
      fail(ec, "send");
  }

  asio::awaitable<std::uint8_t> recv_u8(ms deadline) {
    std::uint8_t v = 0;
    if (auto ec = co_await read_exact(*socket_, &v, 1, deadline))
      fail(ec, "receive");
    co_return v;
  }

  asio::awaitable<std::int64_t> recv_i64(ms deadline) {
    std::int64_t v = 0;
    if (auto ec = co_await read_exact(*socket_, &v, sizeof v, deadline))
      fail(ec, "receive");
    co_return v;
  }

  asio::awaitable<std::string> recv_bytes() {
    std::uint64_t n = 0;
    if (auto ec = co_await read_exact(*socket_, &n, sizeof n, options().timeout))
      fail(ec, "receive");
    if (n > options().connection.max_frame_size) {
      drop();
      throw protocol_error("store: PyTorch TCPStore at " + where(remote_endpoint()) + " sent a value of " +
                           std::to_string(n) + " bytes (limit " + std::to_string(options().connection.max_frame_size) +
                           ")");
    }
    std::string v(n, '\0');
    if (n)
      if (auto ec = co_await read_exact(*socket_, v.data(), n, options().timeout))
        fail(ec, "receive");
    co_return v;
  }

  /// The socket is unusable after a failed or timed-out transfer: drop it (the
  /// next query reconnects) and throw.
  [[noreturn]] void throw_closed() const {
    throw connection_error("store: PyTorch TCPStore client of " + where(remote_endpoint()) +
                           " closed: its event loop is shutting down");
  }

  [[noreturn]] void fail(std::error_code ec, const char* what) {
    drop();
    auto msg = std::string("store: ") + what + " to PyTorch TCPStore at " + where(remote_endpoint()) + ": ";
    if (ec == asio::error::timed_out)
      throw timeout_error(msg + "no answer within " + std::to_string(options().timeout.count()) + " ms");
    throw connection_error(msg + ec.message());
  }

  void drop() {
    if (!socket_)
      return;
    std::error_code ignored;
    socket_->close(ignored);
    socket_.reset();
  }

  version version_;
  std::shared_ptr<asio::ip::tcp::socket> socket_;
  struct turn {
    explicit turn(const asio::any_io_executor& ex) : timer(ex, asio::steady_timer::time_point::max()) {}
    asio::steady_timer timer;
    bool granted = false;
  };
  bool busy_ = false;
  bool closed_ = false; // by the event loop, at its shutdown: no query runs after
  std::deque<std::shared_ptr<turn>> queue_;
  corodist::detail::io_registration registration_; // last: goes first
};

} // namespace

asio::awaitable<std::shared_ptr<tcp_store>> connect_torch(asio::any_io_executor ex, tcp_store_options opts) {
  const auto v = opts.protocol == wire_protocol::pytorch_1_13 ? version::v1 : version::v2;
  connect_attempt attempt = [&](asio::ip::tcp::endpoint ep,
                                ms left) -> asio::awaitable<std::pair<std::error_code, std::shared_ptr<tcp_store>>> {
    asio::ip::tcp::socket s(ex);
    if (auto ec = co_await open_socket(s, ep, v, left))
      co_return std::pair{ec, std::shared_ptr<tcp_store>{}};
    co_return std::pair{std::error_code{},
                        std::shared_ptr<tcp_store>(std::make_shared<torch_client>(ex, opts, ep, std::move(s), v))};
  };
  auto st = co_await connect_with_retry(ex, opts, attempt);
  co_await static_cast<torch_client&>(*st).register_worker();
  co_return st;
}

} // namespace corodist::store::detail
