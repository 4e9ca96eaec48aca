#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "store/codec.hpp"
#include "store/kv_state.hpp"
#include "store/tcp_connect.hpp"

#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <random>

namespace corodist::store {

using detail::op;
using detail::reader;
using detail::status;
using detail::writer;

namespace {
using corodist::detail::use_tuple;
constexpr auto first_backoff = std::chrono::milliseconds(10);
constexpr auto max_backoff = std::chrono::milliseconds(1000);
// The server times waits out; the client's own deadline comes this much later.
constexpr auto wait_grace = std::chrono::seconds(10);

bool permanent(std::error_code ec) {
  return ec == net::errc::bad_magic || ec == net::errc::unsupported_version || ec == net::errc::auth_required ||
         ec == net::errc::auth_failed || ec == net::errc::auth_not_offered || ec == net::errc::bad_hello;
}

std::string where(const tcp_store_options& o) { return o.host + ":" + std::to_string(o.port); }
} // namespace

namespace detail {

asio::awaitable<std::shared_ptr<tcp_store>> connect_with_retry(asio::any_io_executor ex, const tcp_store_options& opts,
                                                               const connect_attempt& attempt_fn) {
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  thread_local std::mt19937_64 rng(std::random_device{}()); // jitter only: no need to reseed per connect
  auto backoff = first_backoff;
  std::error_code last;
  asio::ip::tcp::resolver resolver(ex);
  for (int attempt = 1;; ++attempt) {
    auto [rec, results] = co_await resolver.async_resolve(opts.host, std::to_string(opts.port), use_tuple);
    if (rec) {
      last = rec;
    } else {
      for (const auto& entry : results) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        auto [ec, store] = co_await attempt_fn(entry.endpoint(), std::max(std::chrono::milliseconds(1), left));
        if (!ec) {
          if (attempt > 1)
            CORODIST_LOG_INFO("store: connected to {} after {} attempts", where(opts), attempt);
          co_return store;
        }
        if (permanent(ec))
          net::throw_net_error(ec, "store: connecting to " + where(opts));
        last = ec;
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      throw timeout_error("store: could not connect to " + where(opts) + " within " +
                          std::to_string(opts.timeout.count()) + " ms (" + std::to_string(attempt) +
                          " attempts; last error: " + last.message() + ")");
    // Exponential backoff with +-25 % jitter, never past the deadline.
    std::uniform_real_distribution<double> jitter(0.75, 1.25);
    auto pause = std::chrono::duration_cast<std::chrono::milliseconds>(backoff * jitter(rng));
    pause = std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    asio::steady_timer t(ex, pause);
    co_await t.async_wait(use_tuple);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

} // namespace detail

asio::awaitable<std::shared_ptr<tcp_store>> tcp_store::connect(asio::any_io_executor ex, tcp_store_options opts) {
  if (opts.protocol != wire_protocol::native)
    co_return co_await detail::connect_torch(std::move(ex), std::move(opts));
  opts.connection.auth_token = resolve_auth_token(opts.auth_token);
  opts.connection.request_timeout = std::chrono::milliseconds(0); // deadlines are set per call
  // Named, not a temporary in the co_await expression (GCC 12 destroys those twice).
  detail::connect_attempt attempt =
      [&](asio::ip::tcp::endpoint ep,
          std::chrono::milliseconds left) -> asio::awaitable<std::pair<std::error_code, std::shared_ptr<tcp_store>>> {
        auto copts = opts.connection;
        copts.handshake_timeout = std::min(copts.handshake_timeout, left);
        auto [ec, conn] = co_await net::connection::connect(ex, ep, copts);
        if (ec)
          co_return std::pair{ec, std::shared_ptr<tcp_store>{}};
        co_return std::pair{std::error_code{}, std::make_shared<tcp_store>(ex, std::move(conn), opts)};
      };
  co_return co_await detail::connect_with_retry(ex, opts, attempt);
}

std::shared_ptr<tcp_store> tcp_store::connect_sync(asio::any_io_executor ex, tcp_store_options opts) {
  return run_blocking(ex, connect(ex, std::move(opts)), "tcp_store::connect_sync");
}

tcp_store::tcp_store(asio::any_io_executor ex, std::shared_ptr<net::connection> conn, tcp_store_options opts)
    : ex_(std::move(ex)), conn_(std::move(conn)), opts_(std::move(opts)), remote_(conn_->remote_endpoint()) {
  set_timeout(opts_.timeout);
  // Callbacks run on the loop and may outlive us: they check `alive_` first.
  std::weak_ptr<bool> alive = alive_;
  conn_->start(
      [this, alive](const std::shared_ptr<net::connection>&, net::message&& m) {
        if (!alive.expired())
          on_frame(std::move(m));
      },
      [this, alive](std::error_code ec) {
        if (!alive.expired())
          on_closed(ec);
      });
}

tcp_store::tcp_store(asio::any_io_executor ex, tcp_store_options opts, asio::ip::tcp::endpoint remote)
    : ex_(std::move(ex)), opts_(std::move(opts)), remote_(remote) {
  set_timeout(opts_.timeout);
}

tcp_store::~tcp_store() {
  alive_.reset();
  if (conn_)
    asio::post(ex_, [c = conn_] { c->close(); });
}

void tcp_store::close() {
  if (conn_)
    asio::post(ex_, [c = conn_] { c->close(); });
}

void tcp_store::on_frame(net::message&& m) {
  if (m.header.kind != static_cast<std::uint16_t>(op::watch_event))
    return;
  try {
    reader in(m.payload);
    auto id = in.u64();
    watch_event e;
    e.type = static_cast<watch_event::kind>(in.u8());
    e.key = in.str();
    e.value = in.str();
    if (auto it = watches_.find(id); it != watches_.end())
      if (auto q = it->second.lock())
        q->push(std::move(e));
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("store: bad watch event from {}: {}", where(opts_), e.what());
  }
}

void tcp_store::on_closed(std::error_code ec) {
  auto err = std::make_exception_ptr(connection_error("store: connection to " + where(opts_) + " lost: " + ec.message()));
  for (auto& [id, w] : watches_)
    if (auto q = w.lock())
      q->fail(err);
  watches_.clear();
}

asio::awaitable<net::bytes> tcp_store::call(std::uint16_t kind, net::bytes payload,
                                            std::optional<std::chrono::milliseconds> wait) {
  std::chrono::milliseconds deadline = opts_.timeout;
  if (wait)
    deadline = wait->count() > 0 ? *wait + wait_grace : std::chrono::milliseconds(0);
  auto r = co_await conn_->request(kind, std::move(payload), {}, deadline);
  if (r.ec == net::errc::remote_failure)
    throw store_error("store server: " + std::string(reinterpret_cast<const char*>(r.msg.payload.data()),
                                                     r.msg.payload.size()));
  net::throw_net_error(r.ec, "store: request to " + where(opts_));
  reader in(r.msg.payload);
  auto st = static_cast<status>(in.u8());
  if (st == status::timeout)
    throw timeout_error(in.str());
  if (st == status::error)
    throw store_error("store server: " + in.str());
  co_return std::move(r.msg.payload); // status byte included: read results with result_of()
}

namespace {
std::uint16_t k(op o) { return static_cast<std::uint16_t>(o); }
// The result fields of a response `call` returned: after its status byte.
reader result_of(const net::bytes& b) { return reader(b, 1); }
std::uint64_t ms(std::chrono::milliseconds t) { return static_cast<std::uint64_t>(std::max<std::int64_t>(0, t.count())); }
} // namespace

asio::awaitable<void> tcp_store::do_set(std::string key, std::string value) {
  co_await call(k(op::set), writer().str(key).str(value).take(), std::nullopt);
}

asio::awaitable<std::string> tcp_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  auto b = co_await call(k(op::get), writer().str(key).u64(ms(timeout)).take(), timeout);
  reader in = result_of(b);
  in.u32();
  co_return in.str();
}

asio::awaitable<std::int64_t> tcp_store::do_add(std::string key, std::int64_t delta) {
  auto b = co_await call(k(op::add), writer().str(key).i64(delta).take(), std::nullopt);
  co_return result_of(b).i64();
}

asio::awaitable<std::string> tcp_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  auto b = co_await call(k(op::compare_set), writer().str(key).str(expected).str(desired).take(), std::nullopt);
  co_return result_of(b).str();
}

asio::awaitable<bool> tcp_store::do_delete_key(std::string key) {
  auto b = co_await call(k(op::delete_key), writer().str(key).take(), std::nullopt);
  co_return result_of(b).u8() != 0;
}

asio::awaitable<bool> tcp_store::do_check(std::vector<std::string> keys) {
  auto b = co_await call(k(op::check), writer().strs(keys).take(), std::nullopt);
  co_return result_of(b).u8() != 0;
}

asio::awaitable<void> tcp_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  co_await call(k(op::wait), writer().strs(keys).u64(ms(timeout)).take(), timeout);
}

asio::awaitable<std::int64_t> tcp_store::do_num_keys() {
  auto b = co_await call(k(op::num_keys), {}, std::nullopt);
  co_return result_of(b).i64();
}

asio::awaitable<void> tcp_store::do_append(std::string key, std::string value) {
  co_await call(k(op::append), writer().str(key).str(value).take(), std::nullopt);
}

asio::awaitable<std::vector<std::string>> tcp_store::do_multi_get(std::vector<std::string> keys,
                                                                   std::chrono::milliseconds timeout) {
  auto b = co_await call(k(op::multi_get), writer().strs(keys).u64(ms(timeout)).take(), timeout);
  co_return result_of(b).strs(keys.size());
}

asio::awaitable<void> tcp_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  detail::check_multi_set(keys, values);
  co_await call(k(op::multi_set), writer().strs(keys).strs(values).take(), std::nullopt);
}

asio::awaitable<std::vector<std::string>> tcp_store::do_list_keys(std::string prefix) {
  auto b = co_await call(k(op::list_keys), writer().str(prefix).take(), std::nullopt);
  co_return result_of(b).strs(std::numeric_limits<std::uint32_t>::max());
}

asio::awaitable<watch_stream> tcp_store::do_watch_key(std::string key) {
  const auto id = next_watch_++;
  auto q = std::make_shared<detail::watch_queue>(ex_);
  watches_[id] = q; // registered first: events may follow the response at once
  try {
    co_await call(k(op::watch), writer().str(key).u64(id).take(), std::nullopt);
  } catch (...) {
    watches_.erase(id);
    throw;
  }
  std::weak_ptr<bool> alive = alive_;
  q->on_close = [this, alive, id] {
    if (alive.expired())
      return;
    watches_.erase(id);
    if (conn_->is_open())
      asio::co_spawn(
          ex_,
          [c = conn_, id]() -> asio::awaitable<void> {
            co_await c->request(k(op::unwatch), writer().u64(id).take());
          },
          asio::detached);
  };
  co_return watch_stream(q);
}

} // namespace corodist::store
