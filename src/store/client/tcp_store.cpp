#include <corodist/core/error.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/store/errors.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/metrics/metrics_server.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/store/auth_token.hpp>
#include <corodist/store/tcp_store.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "store/client/connect_retry.hpp"
#include "store/server/engine.hpp"
#include "store/wire/native/reply.hpp"
#include "store/wire/native/request.hpp"
#include "store/wait_log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>

#include <optional>
#include <span>
#include <unordered_map>

namespace corodist::store {

namespace {
// How long past a wait's deadline the client waits for the server's answer
// (the server times the wait out at the deadline itself; its answer names
// the missing keys). Only a server or network that is gone uses it up.
constexpr auto answer_allowance = std::chrono::seconds(1);
} // namespace

namespace {

std::uint16_t code(detail::op o) { return static_cast<std::uint16_t>(o); }

/// The keys a waiting request awaits (for the wait log); empty for the others.
std::span<const std::string> awaited_keys(const detail::request& r) {
  if (auto* g = std::get_if<detail::get_request>(&r))
    return {&g->key, 1};
  if (auto* w = std::get_if<detail::wait_request>(&r))
    return w->keys;
  if (auto* m = std::get_if<detail::multi_get_request>(&r))
    return m->keys;
  return {};
}

/// A request's operation, as its flight-recorder entry names it.
std::string_view op_name(detail::op o) noexcept {
  switch (o) {
  case detail::op::set: return "set";
  case detail::op::get: return "get";
  case detail::op::add: return "add";
  case detail::op::compare_set: return "compare_set";
  case detail::op::delete_key: return "delete_key";
  case detail::op::check: return "check";
  case detail::op::wait: return "wait";
  case detail::op::num_keys: return "num_keys";
  case detail::op::append: return "append";
  case detail::op::multi_get: return "multi_get";
  case detail::op::multi_set: return "multi_set";
  case detail::op::list_keys: return "list_keys";
  case detail::op::watch: return "watch";
  case detail::op::unwatch: return "unwatch";
  case detail::op::set_owned: return "set_owned";
  case detail::op::watch_event: break;
  }
  return "request";
}

/// The longest part of a key a flight-recorder entry keeps (a key may be
/// megabytes: the ring is not where it should be copied).
constexpr std::size_t recorded_key_max = 256;

/// The key a request is about (the first of several; a listing's prefix), at
/// most `recorded_key_max` bytes of it; "" for none.
std::string_view key_of(const detail::request& r) noexcept {
  const std::string_view key = std::visit(
      [](const auto& q) -> std::string_view {
        if constexpr (requires { q.key; })
          return q.key;
        else if constexpr (requires { q.keys; })
          return q.keys.empty() ? std::string_view() : std::string_view(q.keys.front());
        else if constexpr (requires { q.prefix; })
          return q.prefix;
        else
          return {};
      },
      r);
  return key.substr(0, recorded_key_max);
}
} // namespace

/// The client's connection and the watches it feeds: the tcp_store's
/// implementation. Lives on the executor; the connection's callbacks hold it
/// weakly (the store may be destroyed on another thread while the loop
/// delivers them).
struct tcp_store::impl final : store {
  impl(asio::any_io_executor ex, std::shared_ptr<net::connection> c, tcp_store_options o)
      : ex(std::move(ex)), conn(std::move(c)), opts(std::move(o)), remote(conn->remote_endpoint()),
        waits(this->ex, detail::where(opts)), recorder(flight_recorder::create("store", detail::where(opts))) {}

  /// The impl behind a weak reference, if it is still alive.
  static std::shared_ptr<impl> lock(const std::weak_ptr<store>& w) { return std::static_pointer_cast<impl>(w.lock()); }

  /// Starts the connection. Call once, owned by a shared_ptr.
  void start() {
    conn->start(
        [w = weak_from_this()](const std::shared_ptr<net::connection>&, net::message&& m) {
          if (auto self = lock(w))
            self->on_frame(std::move(m));
        },
        [w = weak_from_this()](std::error_code ec) {
          if (auto self = lock(w))
            self->on_closed(ec);
        });
  }

  void on_frame(net::message&& m) {
    if (m.header.kind != static_cast<std::uint16_t>(detail::op::watch_event))
      return;
    try {
      auto f = detail::decode_watch_event(m.payload);
      if (auto it = watches.find(f.watch_id); it != watches.end())
        if (auto q = it->second.lock())
          q->push(std::move(f.event));
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("store: bad watch event from {}: {}", detail::where(opts), e.what());
    }
  }

  void on_closed(std::error_code ec) {
    CORODIST_LOG_DEBUG("store: connection to {} closed: {}", detail::where(opts), ec.message());
    auto err = std::make_exception_ptr(
        connection_error("store: connection to " + detail::where(opts) + " lost: " + ec.message()));
    for (auto& [id, w] : watches)
      if (auto q = w.lock())
        q->fail(err);
    watches.clear();
  }

  /// Sends `r` and opens its reply, by `by`: a waiting request's deadline
  /// or, for one that does not wait, the store's timeout. A waiting request
  /// carries its remaining time to the server, which times the wait out at
  /// the deadline and answers which keys are missing; the client waits for
  /// that answer `answer_allowance` longer before it gives up on its own.
  /// Each request is recorded (op, key, size) and ended with its outcome.
  asio::awaitable<detail::reply> run(const detail::request& r, corodist::deadline by) {
    const auto kind = detail::kind_of(r);
    auto payload = detail::encode_request(r);
    if (!recorder)
      co_return co_await exchange(r, kind, std::move(payload), by);
    const auto h = recorder->record({.op = op_name(kind), .detail = key_of(r), .bytes = payload.size()});
    try {
      auto reply = co_await exchange(r, kind, std::move(payload), by);
      recorder->complete(h);
      co_return reply;
    } catch (const timeout_error& e) {
      recorder->fail(h, e.what(), "timeout");
      throw;
    } catch (const connection_error& e) {
      recorder->fail(h, e.what(), "connection");
      throw;
    } catch (const store_error& e) {
      recorder->fail(h, e.what(), "store");
      throw;
    } catch (const std::system_error& e) {
      recorder->fail(h, e.what(), e.code() == asio::error::operation_aborted ? "cancelled" : "error");
      throw;
    } catch (const std::exception& e) {
      recorder->fail(h, e.what(), "error");
      throw;
    }
  }

  /// `run`'s exchange of request `r` (encoded: `payload`) and its reply.
  asio::awaitable<detail::reply> exchange(const detail::request& r, detail::op kind, net::bytes payload,
                                          corodist::deadline by) {
    const auto wait = detail::wait_of(r);
    std::optional<detail::wait_log::entry> logged;
    if (wait)
      logged.emplace(waits, awaited_keys(r), *wait);
    const auto give_up = wait && !by.is_never() ? corodist::deadline(by.at() + answer_allowance) : by;
    auto res = co_await conn->request(code(kind), std::move(payload), {}, give_up);
    if (res.ec == net::errc::remote_failure)
      throw store_error("store server: " + std::string(reinterpret_cast<const char*>(res.msg.payload.data()),
                                                       res.msg.payload.size()));
    if (res.ec == net::errc::request_timeout) {
      if (wait) {
        const auto keys = awaited_keys(r);
        throw timeout_error(detail::rules::timeout_message({keys.begin(), keys.end()}, *wait) + " at " +
                            detail::where(opts));
      }
      throw timeout_error("store: no reply from " + detail::where(opts) + " within " + opts.timeout.or_else(default_timeout).str());
    }
    net::throw_net_error(res.ec, "store: request to " + detail::where(opts));
    co_return detail::reply(std::move(res.msg.payload));
  }

  /// As above for a request that does not wait: by the store's timeout.
  asio::awaitable<detail::reply> run(const detail::request& r) { return run(r, opts.timeout.or_else(default_timeout).from()); }

  /// The wire's wait (remaining milliseconds; 0: none) for a deadline.
  static std::chrono::milliseconds wire_wait(corodist::deadline by) {
    return std::chrono::milliseconds(by.to_wire());
  }

  asio::any_io_executor get_executor() override { return ex; }

  // Each operation names its request before awaiting it (GCC 12 destroys an
  // aggregate temporary inside a co_await expression twice).

  asio::awaitable<void> do_set(std::string key, std::string value) override {
    const detail::request r = detail::set_request{std::move(key), std::move(value)};
    co_await run(r);
  }

  asio::awaitable<void> do_set_owned(std::string key, std::string value) override {
    const detail::request r = detail::set_owned_request{std::move(key), std::move(value)};
    co_await run(r);
  }

  asio::awaitable<std::string> do_get(std::string key, corodist::deadline by) override {
    const detail::request r = detail::get_request{std::move(key), wire_wait(by)};
    auto reply = co_await run(r, by);
    co_return reply.str();
  }

  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    const detail::request r = detail::add_request{std::move(key), delta};
    auto reply = co_await run(r);
    co_return reply.i64();
  }

  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override {
    const detail::request r = detail::compare_set_request{std::move(key), std::move(expected), std::move(desired)};
    auto reply = co_await run(r);
    co_return reply.str();
  }

  asio::awaitable<bool> do_delete_key(std::string key) override {
    const detail::request r = detail::delete_key_request{std::move(key)};
    auto reply = co_await run(r);
    co_return reply.u8() != 0;
  }

  asio::awaitable<bool> do_check(std::vector<std::string> keys) override {
    const detail::request r = detail::check_request{std::move(keys)};
    auto reply = co_await run(r);
    co_return reply.u8() != 0;
  }

  asio::awaitable<void> do_wait(std::vector<std::string> keys, corodist::deadline by) override {
    const detail::request r = detail::wait_request{std::move(keys), wire_wait(by)};
    co_await run(r, by);
  }

  asio::awaitable<std::int64_t> do_num_keys() override {
    const detail::request r = detail::num_keys_request{};
    auto reply = co_await run(r);
    co_return reply.i64();
  }

  asio::awaitable<void> do_append(std::string key, std::string value) override {
    const detail::request r = detail::append_request{std::move(key), std::move(value)};
    co_await run(r);
  }

  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                         corodist::deadline by) override {
    const detail::request r = detail::multi_get_request{std::move(keys), wire_wait(by)};
    auto reply = co_await run(r, by);
    co_return reply.strs();
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override {
    detail::rules::check_multi_set(keys, values);
    const detail::request r = detail::multi_set_request{std::move(keys), std::move(values)};
    co_await run(r);
  }

  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) override {
    const detail::request r = detail::list_keys_request{std::move(prefix)};
    auto reply = co_await run(r);
    co_return reply.strs();
  }

  asio::awaitable<watch_stream> do_watch_key(std::string key) override {
    const auto id = next_watch++;
    auto q = std::make_shared<detail::watch_queue>(ex);
    watches[id] = q; // registered first: events may follow the reply at once
    try {
      const detail::request r = detail::watch_request{std::move(key), id};
      co_await run(r);
    } catch (...) {
      watches.erase(id);
      throw;
    }
    q->on_close = [w = weak_from_this(), id] {
      auto self = lock(w);
      if (!self)
        return;
      self->watches.erase(id);
      if (!self->conn->is_open())
        return;
      const detail::request r = detail::unwatch_request{id};
      asio::co_spawn(
          self->ex,
          [c = self->conn, payload = detail::encode_request(r)]() mutable -> asio::awaitable<void> {
            co_await c->request(static_cast<std::uint16_t>(detail::op::unwatch), std::move(payload));
          },
          asio::detached);
    };
    co_return watch_stream(q);
  }

  asio::any_io_executor ex;
  std::shared_ptr<net::connection> conn;
  tcp_store_options opts;
  asio::ip::tcp::endpoint remote;
  std::unordered_map<std::uint64_t, std::weak_ptr<detail::watch_queue>> watches;
  std::uint64_t next_watch = 1;
  detail::wait_log waits;
  std::shared_ptr<flight_recorder> recorder; // this client's requests; null: recording off
};

asio::awaitable<std::shared_ptr<tcp_store>> tcp_store::connect(asio::any_io_executor ex, tcp_store_options opts) {
  if (opts.protocol != wire_protocol::native)
    throw usage_error("tcp_store::connect speaks the native protocol only: connect to a PyTorch TCPStore master with "
                      "torch_store::connect (or connect_store, which picks the client from opts.protocol)");
  metrics::start_from_environment(); // CORODIST_METRICS_PORT: a job's process starts its metrics here
  opts.connection.auth_token = resolve_auth_token(opts.auth_token);
  opts.connection.request_timeout = corodist::timeout::never(); // deadlines are set per call
  if (!opts.connection.tls) {
    if (auto t = net::resolve_tls_options(opts.tls)) {
      std::error_code not_ip;
      (void)asio::ip::make_address(opts.host, not_ip);
      if (t->server_name.empty() && not_ip) // a host name: the certificate must carry it
        t->server_name = opts.host;
      opts.connection.tls = net::tls_context::make(*t);
    }
  }
  if (auto source = detail::source_address(ex, opts))
    opts.connection.local_address = source;
  std::shared_ptr<tcp_store> made;
  // Named, not a temporary in the co_await expression (GCC 12 destroys those twice).
  detail::connect_attempt attempt = [&](asio::ip::tcp::endpoint ep,
                                        corodist::deadline by) -> asio::awaitable<std::error_code> {
    auto copts = opts.connection;
    copts.handshake_timeout =
        earliest(copts.handshake_timeout.or_else(net::connection_options::default_handshake_timeout).from(), by)
            .left();
    auto [ec, conn] = co_await net::connection::connect(ex, ep, copts);
    if (!ec) {
      auto im = std::make_shared<impl>(ex, std::move(conn), opts);
      im->start();
      made.reset(new tcp_store(std::move(im)));
    }
    co_return ec;
  };
  co_await detail::connect_with_retry(ex, opts, "store server", attempt);
  co_return made;
}

std::shared_ptr<tcp_store> tcp_store::connect_sync(asio::any_io_executor ex, tcp_store_options opts) {
  return run_blocking(ex, connect(ex, std::move(opts)), "tcp_store::connect_sync");
}

tcp_store::tcp_store(std::shared_ptr<impl> im) : basic_store(im) { set_timeout(im->opts.timeout); }

tcp_store::~tcp_store() { close(); }

asio::ip::tcp::endpoint tcp_store::remote_endpoint() const noexcept {
  return static_cast<const impl&>(*implementation()).remote;
}

void tcp_store::close() {
  auto& im = static_cast<impl&>(*implementation());
  asio::post(im.ex, [c = im.conn] { c->close(); });
}

} // namespace corodist::store
