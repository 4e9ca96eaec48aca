#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/auth_token.hpp>
#include <corodist/store/tcp_store.hpp>

#include "core/log.hpp"
#include "store/connect_retry.hpp"
#include "store/engine.hpp"
#include "store/reply.hpp"
#include "store/request.hpp"
#include "store/wait_log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

namespace corodist::store {

namespace detail {

namespace {
// The server times waits out; the client's own deadline comes this much later.
constexpr auto wait_grace = std::chrono::seconds(10);

std::uint16_t code(op o) { return static_cast<std::uint16_t>(o); }

/// The keys a waiting request awaits (for the wait log); empty for the others.
std::span<const std::string> awaited_keys(const request& r) {
  if (auto* g = std::get_if<get_request>(&r))
    return {&g->key, 1};
  if (auto* w = std::get_if<wait_request>(&r))
    return w->keys;
  if (auto* m = std::get_if<multi_get_request>(&r))
    return m->keys;
  return {};
}
} // namespace

/// Sends one request of a tcp_store and opens its reply.
struct tcp_call {
  /// The request's deadline is its own wait (plus wait_grace; none for a wait
  /// without one) or, for a request that does not wait, the store's timeout.
  static asio::awaitable<reply> run(tcp_store& s, const request& r) {
    const auto wait = wait_of(r);
    const auto deadline =
        !wait ? s.opts_.timeout : wait->count() > 0 ? *wait + wait_grace : std::chrono::milliseconds(0);
    std::optional<wait_log::entry> logged;
    if (wait)
      logged.emplace(*s.waits_, awaited_keys(r), *wait);
    auto res = co_await s.conn_->request(code(kind_of(r)), encode_request(r), {}, deadline);
    if (res.ec == net::errc::remote_failure)
      throw store_error("store server: " + std::string(reinterpret_cast<const char*>(res.msg.payload.data()),
                                                       res.msg.payload.size()));
    if (res.ec == net::errc::request_timeout)
      throw timeout_error("store: no reply from " + where(s.opts_) + " within " + duration_text(deadline));
    net::throw_net_error(res.ec, "store: request to " + where(s.opts_));
    co_return reply(std::move(res.msg.payload));
  }
};

} // namespace detail

using detail::tcp_call;

asio::awaitable<std::shared_ptr<tcp_store>> tcp_store::connect(asio::any_io_executor ex, tcp_store_options opts) {
  if (opts.protocol != wire_protocol::native)
    throw usage_error("tcp_store::connect speaks the native protocol only: connect to a PyTorch TCPStore master with "
                      "torch_store::connect (or connect_store, which picks the client from opts.protocol)");
  opts.connection.auth_token = resolve_auth_token(opts.auth_token);
  opts.connection.request_timeout = std::chrono::milliseconds(0); // deadlines are set per call
  std::shared_ptr<tcp_store> made;
  // Named, not a temporary in the co_await expression (GCC 12 destroys those twice).
  detail::connect_attempt attempt = [&](asio::ip::tcp::endpoint ep,
                                        std::chrono::milliseconds left) -> asio::awaitable<std::error_code> {
    auto copts = opts.connection;
    copts.handshake_timeout = std::min(copts.handshake_timeout, left);
    auto [ec, conn] = co_await net::connection::connect(ex, ep, copts);
    if (!ec) {
      made.reset(new tcp_store(ex, std::move(conn), opts));
      made->start();
    }
    co_return ec;
  };
  co_await detail::connect_with_retry(ex, opts, "store server", attempt);
  co_return made;
}

std::shared_ptr<tcp_store> tcp_store::connect_sync(asio::any_io_executor ex, tcp_store_options opts) {
  return run_blocking(ex, connect(ex, std::move(opts)), "tcp_store::connect_sync");
}

tcp_store::tcp_store(asio::any_io_executor ex, std::shared_ptr<net::connection> conn, tcp_store_options opts)
    : ex_(std::move(ex)), conn_(std::move(conn)), opts_(std::move(opts)), remote_(conn_->remote_endpoint()),
      waits_(std::make_unique<detail::wait_log>(ex_, detail::where(opts_))) {
  set_timeout(opts_.timeout);
}

namespace {
// The tcp_store behind a weak reference, if it is still alive.
std::shared_ptr<tcp_store> lock(const std::weak_ptr<store>& w) { return std::static_pointer_cast<tcp_store>(w.lock()); }
} // namespace

void tcp_store::start() {
  conn_->start(
      [w = weak_from_this()](const std::shared_ptr<net::connection>&, net::message&& m) {
        if (auto self = lock(w))
          self->on_frame(std::move(m));
      },
      [w = weak_from_this()](std::error_code ec) {
        if (auto self = lock(w))
          self->on_closed(ec);
      });
}

tcp_store::~tcp_store() {
  asio::post(ex_, [c = conn_] { c->close(); });
}

void tcp_store::close() {
  asio::post(ex_, [c = conn_] { c->close(); });
}

void tcp_store::on_frame(net::message&& m) {
  if (m.header.kind != static_cast<std::uint16_t>(detail::op::watch_event))
    return;
  try {
    auto f = detail::decode_watch_event(m.payload);
    if (auto it = watches_.find(f.watch_id); it != watches_.end())
      if (auto q = it->second.lock())
        q->push(std::move(f.event));
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("store: bad watch event from {}: {}", detail::where(opts_), e.what());
  }
}

void tcp_store::on_closed(std::error_code ec) {
  CORODIST_LOG_DEBUG("store: connection to {} closed: {}", detail::where(opts_), ec.message());
  auto err = std::make_exception_ptr(
      connection_error("store: connection to " + detail::where(opts_) + " lost: " + ec.message()));
  for (auto& [id, w] : watches_)
    if (auto q = w.lock())
      q->fail(err);
  watches_.clear();
}

// Each operation names its request before awaiting it (GCC 12 destroys an
// aggregate temporary inside a co_await expression twice).

asio::awaitable<void> tcp_store::do_set(std::string key, std::string value) {
  const detail::request r = detail::set_request{std::move(key), std::move(value)};
  co_await tcp_call::run(*this, r);
}

asio::awaitable<std::string> tcp_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  const detail::request r = detail::get_request{std::move(key), timeout};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.str();
}

asio::awaitable<std::int64_t> tcp_store::do_add(std::string key, std::int64_t delta) {
  const detail::request r = detail::add_request{std::move(key), delta};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.i64();
}

asio::awaitable<std::string> tcp_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  const detail::request r = detail::compare_set_request{std::move(key), std::move(expected), std::move(desired)};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.str();
}

asio::awaitable<bool> tcp_store::do_delete_key(std::string key) {
  const detail::request r = detail::delete_key_request{std::move(key)};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.u8() != 0;
}

asio::awaitable<bool> tcp_store::do_check(std::vector<std::string> keys) {
  const detail::request r = detail::check_request{std::move(keys)};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.u8() != 0;
}

asio::awaitable<void> tcp_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  const detail::request r = detail::wait_request{std::move(keys), timeout};
  co_await tcp_call::run(*this, r);
}

asio::awaitable<std::int64_t> tcp_store::do_num_keys() {
  const detail::request r = detail::num_keys_request{};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.i64();
}

asio::awaitable<void> tcp_store::do_append(std::string key, std::string value) {
  const detail::request r = detail::append_request{std::move(key), std::move(value)};
  co_await tcp_call::run(*this, r);
}

asio::awaitable<std::vector<std::string>> tcp_store::do_multi_get(std::vector<std::string> keys,
                                                                   std::chrono::milliseconds timeout) {
  const detail::request r = detail::multi_get_request{std::move(keys), timeout};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.strs();
}

asio::awaitable<void> tcp_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  detail::rules::check_multi_set(keys, values);
  const detail::request r = detail::multi_set_request{std::move(keys), std::move(values)};
  co_await tcp_call::run(*this, r);
}

asio::awaitable<std::vector<std::string>> tcp_store::do_list_keys(std::string prefix) {
  const detail::request r = detail::list_keys_request{std::move(prefix)};
  auto reply = co_await tcp_call::run(*this, r);
  co_return reply.strs();
}

asio::awaitable<watch_stream> tcp_store::do_watch_key(std::string key) {
  const auto id = next_watch_++;
  auto q = std::make_shared<detail::watch_queue>(ex_);
  watches_[id] = q; // registered first: events may follow the reply at once
  try {
    const detail::request r = detail::watch_request{std::move(key), id};
    co_await tcp_call::run(*this, r);
  } catch (...) {
    watches_.erase(id);
    throw;
  }
  q->on_close = [w = weak_from_this(), id] {
    auto self = lock(w);
    if (!self)
      return;
    self->watches_.erase(id);
    if (!self->conn_->is_open())
      return;
    const detail::request r = detail::unwatch_request{id};
    asio::co_spawn(
        self->ex_,
        [c = self->conn_, payload = detail::encode_request(r)]() mutable -> asio::awaitable<void> {
          co_await c->request(static_cast<std::uint16_t>(detail::op::unwatch), std::move(payload));
        },
        asio::detached);
  };
  co_return watch_stream(q);
}

} // namespace corodist::store
