/// \file
/// Suite `net`: corodist's framed request/response (net::connection) over
/// loopback, client and server each on an event_loop thread of their own —
/// the same two-thread shape as the raw ping-pong floor.

#include "closed_loop.hpp"
#include "harness.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/listener.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_future.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/core.h>

#include <future>
#include <stdexcept>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
namespace net = corodist::net;

constexpr std::uint16_t kind_echo = 1;
constexpr int pipeline_depth = 64;
constexpr auto case_timeout = std::chrono::seconds(120); // a hung case fails the suite

struct sizes_case {
  const char* name;
  std::size_t bytes;
  std::size_t quick_samples;
  std::size_t full_samples;
};

// Echo server + connected client, each on its own loop thread.
class echo_pair {
public:
  /// Runs `make(executor)` on the client loop and waits (bounded) for its result.
  template <typename F>
  auto run(F make) {
    auto fut = asio::co_spawn(client_loop_.get_executor(), make(asio::any_io_executor(client_loop_.get_executor())),
                              asio::use_future);
    if (fut.wait_for(case_timeout) != std::future_status::ready)
      throw std::runtime_error("net benchmark case timed out");
    return fut.get();
  }

  echo_pair() {
    std::promise<asio::ip::tcp::endpoint> bound;
    asio::post(server_loop_.get_executor(), [&] {
      auto [ec, l] = net::listener::listen(
          server_loop_.get_executor(), {asio::ip::make_address("127.0.0.1"), 0}, {},
          [](std::shared_ptr<net::connection> c) {
            c->start([](const std::shared_ptr<net::connection>& conn, net::message&& m) {
              conn->respond(m.header.request_id, m.header.kind, std::move(m.payload));
            });
          });
      if (ec) {
        bound.set_exception(std::make_exception_ptr(std::runtime_error("listen: " + ec.message())));
        return;
      }
      listener_ = l;
      listener_->start();
      bound.set_value(listener_->local_endpoint());
    });
    server_loop_.start();
    auto ep = bound.get_future().get();
    client_loop_.start();
    conn_ = run([ep](asio::any_io_executor ex) -> asio::awaitable<std::shared_ptr<net::connection>> {
      auto [ec, c] = co_await net::connection::connect(ex, ep);
      if (ec)
        throw std::runtime_error("connect: " + ec.message());
      c->start();
      co_return c;
    });
  }

  ~echo_pair() {
    asio::post(client_loop_.get_executor(), [c = conn_] { c->close(); });
    asio::post(server_loop_.get_executor(), [l = listener_] { l->close(); });
    client_loop_.stop();
    server_loop_.stop();
  }

  std::shared_ptr<net::connection> conn() const { return conn_; }

private:
  event_loop server_loop_;
  event_loop client_loop_;
  std::shared_ptr<net::listener> listener_;
  std::shared_ptr<net::connection> conn_;
};

asio::awaitable<void> one_request(net::connection& c, std::size_t bytes) {
  auto r = co_await c.request(kind_echo, net::bytes(bytes));
  if (r.ec)
    throw std::runtime_error("request: " + r.ec.message());
  if (r.msg.payload.size() != bytes)
    throw std::runtime_error("echo size mismatch");
}

void pingpong(context& ctx, echo_pair& pair, const sizes_case& sc) {
  const std::size_t samples = ctx.quick ? sc.quick_samples : sc.full_samples;
  const double budget_s = ctx.quick ? 4.0 : 30.0;
  auto conn = pair.conn();
  auto [lat, elapsed] = pair.run([&](asio::any_io_executor) -> asio::awaitable<std::pair<latency_recorder, double>> {
    for (std::size_t i = 0; i < std::max<std::size_t>(samples / 10, 10); ++i)
      co_await one_request(*conn, sc.bytes);
    latency_recorder rec(samples);
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < samples; ++i) {
      const auto t0 = clock_type::now();
      co_await one_request(*conn, sc.bytes);
      const auto t1 = clock_type::now();
      rec.add(t1 - t0);
      if (std::chrono::duration<double>(t1 - start).count() > budget_s)
        break;
    }
    co_return std::pair{std::move(rec), std::chrono::duration<double>(clock_type::now() - start).count()};
  });
  auto r = latency_record("net", sc.name, lat, elapsed);
  if (sc.bytes >= 4096)
    r.gbytes_per_s = 2.0 * static_cast<double>(sc.bytes) * static_cast<double>(lat.size()) / elapsed / 1e9;
  r.extra = {{"message_bytes", static_cast<double>(sc.bytes)}, {"samples", static_cast<double>(lat.size())}};
  ctx.report(std::move(r));
}

void pipelined(context& ctx, echo_pair& pair) {
  const std::size_t total = ctx.quick ? 300'000 : 2'000'000;
  auto conn = pair.conn();
  auto [lat, elapsed] = pair.run([&](asio::any_io_executor ex) {
    auto one_request_64B = [conn](int) { return one_request(*conn, 64); };
    return run_closed_loop(ex, pipeline_depth, total, one_request_64B);
  });
  auto r = latency_record("net", "pipelined_64B_x64", lat, elapsed);
  r.extra = {{"in_flight", double(pipeline_depth)}, {"requests", static_cast<double>(lat.size())}};
  ctx.report(std::move(r));
}

void run_net_suite(context& ctx) {
  echo_pair pair;
  static const sizes_case cases[] = {
      {"pingpong_64B", 64, 20'000, 200'000},
      {"pingpong_4KiB", 4096, 10'000, 50'000},
      {"pingpong_1MiB", 1 << 20, 300, 2'000},
  };
  for (const auto& sc : cases)
    pingpong(ctx, pair, sc);
  pipelined(ctx, pair);
}

const suite_registrar registrar("net", &run_net_suite, 20, 4);

} // namespace
} // namespace corodist::bench
