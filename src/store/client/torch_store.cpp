// torch_store: a client of a PyTorch TCPStore master (the 1.13 or the 2.x
// protocol), behaving as PyTorch's own client.

#include <corodist/core/io_registration.hpp>
#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/metrics/metrics_server.hpp>
#include <corodist/net/errors.hpp>
#include <corodist/store/torch_store.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "net/open_from.hpp"
#include "store/client/connect_retry.hpp"
#include "store/server/engine.hpp"
#include "store/wire/torch/query.hpp"
#include "store/wait_log.hpp"

#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <deque>
#include <random>
#include <optional>
#include <system_error>
#include <tuple>

namespace corodist::store {

namespace {

using namespace detail::torch;
using ms = std::chrono::milliseconds;
using corodist::detail::use_tuple;

// PyTorch's client puts this before every user key; its worker counter key has none.
constexpr std::string_view key_prefix = "/";
constexpr std::string_view init_key = "init/";

std::string where(const asio::ip::tcp::endpoint& ep) { return net::detail::endpoint_text(ep); }

/// Awaits a socket transfer within `deadline` (zero: no deadline); the transfer is
/// cancelled when the deadline passes, which gives asio::error::timed_out, and
/// by the caller's cancellation, which gives asio::error::operation_aborted
/// (the caller then drops the socket: a transfer cut short leaves it out of turn).
asio::awaitable<std::error_code> transfer_within(asio::awaitable<std::tuple<std::error_code, std::size_t>> op,
                                                 ms deadline) {
  if (deadline.count() <= 0) {
    auto [ec, n] = co_await std::move(op);
    co_return ec;
  }
  std::optional<std::tuple<std::error_code, std::size_t>> r;
  try {
    r = co_await corodist::detail::within(std::move(op), deadline);
  } catch (const std::system_error& e) {
    if (e.code() != asio::error::operation_aborted)
      throw;
    co_return asio::error::operation_aborted;
  }
  if (!r)
    co_return asio::error::timed_out;
  co_return std::get<0>(*r);
}

asio::awaitable<std::error_code> write_all(asio::ip::tcp::socket& s, const std::string& bytes, ms deadline) {
  co_return co_await transfer_within(asio::async_write(s, asio::buffer(bytes), use_tuple), deadline);
}

asio::awaitable<std::error_code> read_exact(asio::ip::tcp::socket& s, void* p, std::size_t n, ms deadline) {
  co_return co_await transfer_within(asio::async_read(s, asio::buffer(p, n), use_tuple), deadline);
}

/// TCP connect plus, for 2.x, the VALIDATE + PING exchange, within `deadline`.
asio::awaitable<std::error_code> open_socket(asio::ip::tcp::socket& s, const asio::ip::tcp::endpoint& ep, version v,
                                             ms deadline) {
  auto r = co_await corodist::detail::within(s.async_connect(ep, use_tuple), corodist::deadline::from_wire(
                                                                                 static_cast<std::uint64_t>(deadline.count())));
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
  encode_query(v, validate_query{}, hello);
  encode_query(v, ping_query{nonce}, hello);
  if (auto ec = co_await write_all(s, hello, deadline))
    co_return ec;
  std::uint32_t echo = 0;
  if (auto ec = co_await read_exact(s, &echo, sizeof echo, deadline))
    co_return ec == asio::error::timed_out ? std::error_code(net::errc::hello_timeout) : ec;
  if (echo != nonce)
    co_return net::errc::bad_magic; // not a PyTorch 2.x TCPStore
  co_return std::error_code{};
}

std::string prefixed(const std::string& k) { return std::string(key_prefix) + k; }

std::vector<std::string> prefixed(const std::vector<std::string>& ks) {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (auto& k : ks)
    out.push_back(prefixed(k));
  return out;
}

} // namespace

/// The client's state: its socket, and the line of queries waiting for it
/// (PyTorch's protocol has no request ids: queries run one at a time, in
/// arrival order). Lives on the executor.
struct torch_store::impl final : store {
  impl(asio::any_io_executor ex, tcp_store_options o, asio::ip::tcp::endpoint remote, asio::ip::tcp::socket socket,
       version v)
      : executor_(ex), opts(std::move(o)), remote(remote), version_(v),
        socket_(std::make_shared<asio::ip::tcp::socket>(std::move(socket))), waits(ex, where(remote)),
        // Ends a transfer still in flight (whose frame keeps us alive) and every queued
        // caller before the context's services go (Asio issue 1235).
        registration_(ex, [this](bool) { shut("its event loop is shutting down"); }) {}

  ~impl() override {
    if (socket_)
      asio::post(executor_, [s = socket_] {
        std::error_code ignored;
        s->close(ignored);
      });
  }

  /// Held while one query and its response use the socket.
  class guard {
  public:
    explicit guard(impl* c) : c_(c) {}
    guard(guard&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    guard& operator=(guard&&) = delete;
    ~guard() {
      if (c_)
        c_->release();
    }

  private:
    impl* c_;
  };

  asio::awaitable<guard> lock() {
    if (closed_)
      throw_closed();
    if (busy_) {
      auto t = std::make_shared<turn>(executor_);
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

  /// Closes for good: the transfer in flight, the queued callers and later
  /// queries end with connection_error saying `why`.
  void shut(std::string why) {
    if (closed_)
      return;
    closed_ = true;
    closed_why_ = std::move(why);
    drop();
    for (auto& t : queue_)
      t->timer.cancel();
  }

  asio::awaitable<void> send(const query& q) {
    std::string bytes;
    encode_query(version_, q, bytes);
    co_await send_bytes(bytes);
  }

  asio::awaitable<void> send_bytes(const std::string& bytes) {
    if (closed_)
      throw_closed();
    if (!socket_) { // lost, or given up after a 1.13 wait timed out: connect again
      asio::ip::tcp::socket s(executor_);
      if (auto ec = co_await open_socket(s, remote, version_, io_limit()))
        throw connection_error("store: reconnecting to PyTorch TCPStore at " + where(remote) + ": " + ec.message());
      socket_ = std::make_shared<asio::ip::tcp::socket>(std::move(s));
    }
    if (auto ec = co_await write_all(*socket_, bytes, io_limit()))
      fail(ec, "send", io_limit());
  }

  /// The limit of each transfer that does not wait for keys (0: none).
  ms io_limit() const { return corodist::detail::zero_is_none(opts.timeout.or_else(default_timeout)); }
  /// The time left of `by` for a WAIT (0: none), once the lock is held.
  static ms wait_of(corodist::deadline by) { return ms(by.to_wire()); }

  /// WAITs for `keys` (already prefixed); the lock is held.
  asio::awaitable<void> wait_locked(const std::vector<std::string>& keys, ms timeout) {
    detail::wait_log::entry logged(waits, keys, timeout);
    const query q = wait_query{keys};
    co_await send(q);
    std::uint8_t r = 0;
    auto ec = co_await read_exact(*socket_, &r, 1, timeout);
    if (!ec && r == wait_stop_waiting)
      co_return;
    if (!ec) {
      drop();
      throw protocol_error("store: PyTorch TCPStore at " + where(remote) + " answered WAIT with " + std::to_string(r));
    }
    if (ec != asio::error::timed_out)
      fail(ec, "wait", timeout);
    auto message = detail::rules::timeout_message(keys, timeout);
    if (version_ == version::v1) {
      // 1.13 cannot cancel a wait: its answer would arrive later, out of turn.
      drop();
      throw timeout_error(message);
    }
    const query cancel = cancel_wait_query{};
    co_await send(cancel);
    // The wait may have ended just before the cancel: STOP_WAITING, then WAIT_CANCELED.
    auto first = co_await recv_u8();
    if (first == wait_stop_waiting) {
      co_await recv_u8();
      co_return;
    }
    throw timeout_error(message);
  }

  asio::awaitable<std::uint8_t> recv_u8() {
    std::uint8_t v = 0;
    if (auto ec = co_await read_exact(*socket_, &v, 1, io_limit()))
      fail(ec, "receive", io_limit());
    co_return v;
  }

  asio::awaitable<std::int64_t> recv_i64() {
    std::int64_t v = 0;
    if (auto ec = co_await read_exact(*socket_, &v, sizeof v, io_limit()))
      fail(ec, "receive", io_limit());
    co_return v;
  }

  asio::awaitable<std::string> recv_bytes() {
    std::uint64_t n = 0;
    if (auto ec = co_await read_exact(*socket_, &n, sizeof n, io_limit()))
      fail(ec, "receive", io_limit());
    if (n > opts.connection.max_frame_size) {
      drop();
      throw protocol_error("store: PyTorch TCPStore at " + where(remote) + " sent a value of " + std::to_string(n) +
                           " bytes (limit " + std::to_string(opts.connection.max_frame_size) + ")");
    }
    std::string v(n, '\0');
    if (n)
      if (auto ec = co_await read_exact(*socket_, v.data(), n, io_limit()))
        fail(ec, "receive", io_limit());
    co_return v;
  }

  [[noreturn]] void throw_closed() const {
    throw connection_error("store: PyTorch TCPStore client of " + where(remote) + " closed: " + closed_why_);
  }

  /// The socket is unusable after a failed or timed-out transfer: drop it (the
  /// next query reconnects) and throw.
  [[noreturn]] void fail(std::error_code ec, const char* what, ms deadline) {
    drop();
    if (closed_)
      throw_closed();
    auto msg = std::string("store: ") + what + " to PyTorch TCPStore at " + where(remote) + ": ";
    if (ec == asio::error::operation_aborted) // cancelled by the caller
      throw std::system_error(ec, msg + "cancelled");
    if (ec == asio::error::timed_out)
      throw timeout_error(msg + "no answer within " + detail::duration_text(deadline));
    throw connection_error(msg + ec.message());
  }

  void drop() {
    if (!socket_)
      return;
    std::error_code ignored;
    socket_->close(ignored);
    socket_.reset();
  }

  asio::any_io_executor get_executor() override { return executor_; }

  asio::awaitable<void> do_set_owned(std::string key, std::string) override {
    throw usage_error("torch_store: set_owned('" + key + "'): PyTorch's TCPStore protocol has no owned keys; they "
                      "need a tcp_store and a corodist store_server");
    co_return;
  }

  asio::awaitable<void> do_set(std::string key, std::string value) override {
    auto guard = co_await lock();
    const query q = set_query{prefixed(key), std::move(value)};
    co_await send(q);
  }

  asio::awaitable<std::string> do_get(std::string key, corodist::deadline by) override {
    auto guard = co_await lock();
    std::vector<std::string> keys{prefixed(key)};
    co_await wait_locked(keys, wait_of(by)); // PyTorch's client: WAIT, then GET
    const query q = get_query{keys[0]};
    co_await send(q);
    co_return co_await recv_bytes();
  }

  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    auto guard = co_await lock();
    const query q = add_query{prefixed(key), delta};
    co_await send(q);
    co_return co_await recv_i64();
  }

  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override {
    auto guard = co_await lock();
    const query q = compare_set_query{prefixed(key), std::move(expected), std::move(desired)};
    co_await send(q);
    co_return co_await recv_bytes();
  }

  asio::awaitable<bool> do_delete_key(std::string key) override {
    auto guard = co_await lock();
    const query q = delete_key_query{prefixed(key)};
    co_await send(q);
    co_return co_await recv_i64() != 0;
  }

  asio::awaitable<bool> do_check(std::vector<std::string> keys) override {
    auto guard = co_await lock();
    const query q = check_query{prefixed(keys)};
    co_await send(q);
    co_return co_await recv_u8() == check_ready;
  }

  asio::awaitable<void> do_wait(std::vector<std::string> keys, corodist::deadline by) override {
    auto guard = co_await lock();
    co_await wait_locked(prefixed(keys), wait_of(by));
  }

  asio::awaitable<std::int64_t> do_num_keys() override {
    auto guard = co_await lock();
    const query q = num_keys_query{};
    co_await send(q);
    co_return co_await recv_i64();
  }

  asio::awaitable<void> do_append(std::string key, std::string value) override {
    auto guard = co_await lock();
    const query q = append_query{prefixed(key), std::move(value)};
    co_await send(q); // 1.13: store_error (no APPEND)
  }

  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys, corodist::deadline by) override {
    auto guard = co_await lock();
    auto full = prefixed(keys);
    co_await wait_locked(full, wait_of(by));
    std::vector<std::string> values;
    values.reserve(full.size());
    if (version_ == version::v2) {
      const query q = multi_get_query{full};
      co_await send(q);
      for (std::size_t i = 0; i < full.size(); ++i)
        values.push_back(co_await recv_bytes());
    } else { // 1.13 has no MULTI_GET
      for (auto& k : full) {
        const query q = get_query{k};
        co_await send(q);
        values.push_back(co_await recv_bytes());
      }
    }
    co_return values;
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override {
    detail::rules::check_multi_set(keys, values);
    auto guard = co_await lock();
    std::string bytes;
    if (version_ == version::v2) {
      encode_query(version_, multi_set_query{prefixed(keys), std::move(values)}, bytes);
    } else { // 1.13 has no MULTI_SET: one SET each, written together
      for (std::size_t i = 0; i < keys.size(); ++i)
        encode_query(version_, set_query{prefixed(keys[i]), std::move(values[i])}, bytes);
    }
    co_await send_bytes(bytes);
  }

  asio::awaitable<std::vector<std::string>> do_list_keys(std::string) override {
    throw store_error("list_keys is not in the PyTorch TCPStore protocol");
    co_return std::vector<std::string>{};
  }

  asio::awaitable<watch_stream> do_watch_key(std::string) override {
    throw store_error("watch_key is not supported with the PyTorch TCPStore protocol");
    co_return watch_stream{};
  }

  asio::any_io_executor executor_;
  tcp_store_options opts;
  asio::ip::tcp::endpoint remote;
  version version_;
  std::shared_ptr<asio::ip::tcp::socket> socket_;
  struct turn {
    explicit turn(const asio::any_io_executor& ex) : timer(ex, asio::steady_timer::time_point::max()) {}
    asio::steady_timer timer;
    bool granted = false;
  };
  bool busy_ = false;
  bool closed_ = false; // by close() or the event loop's shutdown: no query runs after
  std::string closed_why_;
  std::deque<std::shared_ptr<turn>> queue_;
  detail::wait_log waits;
  corodist::io_registration registration_; // last: goes first
};

asio::awaitable<std::shared_ptr<torch_store>> torch_store::connect(asio::any_io_executor ex, tcp_store_options opts) {
  if (opts.protocol == wire_protocol::native)
    throw usage_error("torch_store::connect speaks the PyTorch TCPStore protocols: use tcp_store::connect for a "
                      "corodist store_server (or connect_store, which picks the client from opts.protocol)");
  metrics::start_from_environment(); // CORODIST_METRICS_PORT: a job's process starts its metrics here
  const auto v = opts.protocol == wire_protocol::pytorch_1_13 ? version::v1 : version::v2;
  if (auto source = detail::source_address(ex, opts))
    opts.connection.local_address = source;
  std::shared_ptr<torch_store> made;
  // Named, not a temporary in the co_await expression (GCC 12 destroys those twice).
  detail::connect_attempt attempt = [&](asio::ip::tcp::endpoint ep,
                                        corodist::deadline by) -> asio::awaitable<std::error_code> {
    const ms left(by.to_wire());
    asio::ip::tcp::socket s(ex);
    if (auto ec = net::detail::open_from(s, ep, opts.connection.local_address))
      co_return ec;
    if (auto ec = co_await open_socket(s, ep, v, left))
      co_return ec;
    made.reset(new torch_store(std::make_shared<impl>(ex, opts, ep, std::move(s), v)));
    co_return std::error_code{};
  };
  co_await detail::connect_with_retry(ex, opts, "PyTorch TCPStore", attempt);
  made->set_timeout(opts.timeout);
  { // Counts this client in the master's worker counter, as PyTorch's clients do.
    auto& im = static_cast<impl&>(*made->implementation());
    auto guard = co_await im.lock();
    const query q = add_query{std::string(init_key), 1};
    co_await im.send(q);
    (void)co_await im.recv_i64();
  }
  co_return made;
}

std::shared_ptr<torch_store> torch_store::connect_sync(asio::any_io_executor ex, tcp_store_options opts) {
  return run_blocking(ex, connect(ex, std::move(opts)), "torch_store::connect_sync");
}

torch_store::torch_store(std::shared_ptr<impl> im) : basic_store(std::move(im)) {}

torch_store::~torch_store() = default;

asio::ip::tcp::endpoint torch_store::remote_endpoint() const noexcept {
  return static_cast<const impl&>(*implementation()).remote;
}

wire_protocol torch_store::protocol() const noexcept {
  return static_cast<const impl&>(*implementation()).opts.protocol;
}

void torch_store::close() {
  auto im = std::static_pointer_cast<impl>(implementation());
  asio::post(im->get_executor(), [w = std::weak_ptr<impl>(im)] {
    if (auto im = w.lock())
      im->shut("closed by close()");
  });
}

} // namespace corodist::store
