// Failure detection on net::connection (peer_timeout): heartbeats keep an
// idle connection open and never reach a handler; a peer that hangs
// (SIGSTOP) or goes silent is detected (errc::peer_timed_out), a killed one
// at once; the connections of a loop share its heartbeat wheel, which
// survives connections leaving in the middle of its turn and stops when the
// last one has gone. Peers are real processes where the fault is a process's.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/net/listener.hpp>

#include "support/child_process.hpp"
#include "support/coro_test.hpp"
#include "support/loop_helpers.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <future>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace net = corodist::net;
using asio::ip::tcp;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::closed_by_peer;
using corodist::test::pipe_pair;
using corodist::test::run_coro;

namespace {

constexpr std::uint16_t kind_echo = 1;
constexpr std::uint16_t kind_hold = 2; // never answered
constexpr auto short_timeout = 300ms;

net::connection_options short_options() {
  net::connection_options o;
  o.peer_timeout = short_timeout;
  return o;
}

// Serves kind_echo (answered) and kind_hold (never answered); every frame that
// reaches the handler is recorded in `kinds` (when given).
void serve(const std::shared_ptr<net::connection>& c, std::shared_ptr<std::vector<std::uint16_t>> kinds = {},
           net::connection::close_handler on_close = {}) {
  c->start(
      [kinds](const std::shared_ptr<net::connection>& conn, net::message&& m) {
        if (kinds)
          kinds->push_back(m.header.kind);
        if (m.header.kind == kind_echo && !(m.header.flags & net::frame_flags::one_way))
          conn->respond(m.header.request_id, m.header.kind, std::move(m.payload));
      },
      std::move(on_close));
}

// A server on an event loop thread of this process; it records the kinds its
// handler sees and the reasons its connections closed with.
struct local_server {
  explicit local_server(net::connection_options opts) {
    std::promise<tcp::endpoint> ready;
    asio::post(loop.get_executor(), [&] {
      auto [ec, l] = net::listener::listen(loop.get_executor(), {asio::ip::make_address("127.0.0.1"), 0}, opts,
                                           [this](std::shared_ptr<net::connection> c) {
                                             serve(c, kinds, [this](std::error_code ec) {
                                               closed.push_back(ec);
                                               if (on_closed)
                                                 on_closed(ec);
                                             });
                                           });
      BOOST_REQUIRE(!ec);
      listener = l;
      listener->start();
      ready.set_value(listener->local_endpoint());
    });
    loop.start();
    endpoint = ready.get_future().get();
  }
  ~local_server() {
    asio::post(loop.get_executor(), [l = listener] { l->close(); });
    loop.stop();
  }
  // Before the loop: the loop's destruction closes what is left, and the close handler records it here.
  std::shared_ptr<std::vector<std::uint16_t>> kinds = std::make_shared<std::vector<std::uint16_t>>();
  std::vector<std::error_code> closed;         // (loop thread)
  std::function<void(std::error_code)> on_closed; // (loop thread) set before connecting
  event_loop loop;
  std::shared_ptr<net::listener> listener;
  tcp::endpoint endpoint;
};

// The body of a child process that serves echo and hold with a short
// peer_timeout and writes its port to `port_fd`.
std::function<int()> server_body(int port_fd) {
  return [port_fd] {
    asio::io_context ctx;
    auto [ec, l] = net::listener::listen(ctx.get_executor(), {asio::ip::make_address("127.0.0.1"), 0},
                                         short_options(), [](std::shared_ptr<net::connection> c) { serve(c); });
    if (ec)
      return 1;
    l->start();
    const std::uint16_t port = l->local_endpoint().port();
    if (!corodist::test::write_all(port_fd, &port, sizeof port))
      return 1;
    ctx.run_for(60s);
    return 0;
  };
}

std::uint16_t read_port(pipe_pair& p) {
  p.close_write();
  std::uint16_t port = 0;
  BOOST_REQUIRE(corodist::test::read_all(p.read_end(), &port, sizeof port));
  return port;
}

asio::awaitable<std::shared_ptr<net::connection>> connect_to(tcp::endpoint ep, net::connection_options opts,
                                                             net::connection::close_handler on_close = {}) {
  auto [ec, c] = co_await net::connection::connect(co_await asio::this_coro::executor, ep, opts);
  BOOST_REQUIRE_MESSAGE(!ec, "connect: " << ec.message());
  c->start({}, std::move(on_close));
  co_return c;
}

// A server on the test's own context that answers the hello and then says
// nothing, ever (no heartbeat, no reply); its sockets stay open until it goes.
struct silent_server {
  explicit silent_server(asio::io_context& ctx) : acceptor(ctx, {asio::ip::make_address("127.0.0.1"), 0}) {
    asio::co_spawn(ctx, accept_loop(), asio::detached);
  }
  asio::awaitable<void> accept_loop() {
    constexpr auto tuple = asio::experimental::as_tuple(asio::use_awaitable);
    for (;;) {
      auto [ec, s] = co_await acceptor.async_accept(tuple);
      if (ec)
        co_return;
      std::array<std::byte, net::hello_size> theirs;
      if (auto [rec, n] = co_await asio::async_read(s, asio::buffer(theirs), tuple); rec)
        continue;
      const auto mine = net::encode(net::hello{});
      if (auto [wec, n] = co_await asio::async_write(s, asio::buffer(mine), tuple); wec)
        continue;
      sockets.push_back(std::move(s));
    }
  }
  void close() {
    std::error_code ignored;
    acceptor.close(ignored);
    sockets.clear();
  }
  tcp::endpoint endpoint() const { return acceptor.local_endpoint(); }

  tcp::acceptor acceptor;
  std::vector<tcp::socket> sockets;
};

} // namespace

BOOST_AUTO_TEST_SUITE(heartbeats)

// Both sides with a 300 ms peer_timeout and nothing to say for three times
// that: the heartbeats keep the connection open, and none of them reaches
// the handler. Without them each side would close at 300 ms.
BOOST_AUTO_TEST_CASE(idle_connection_stays_open_and_heartbeats_never_reach_the_handler, *utf::timeout(60)) {
  local_server srv(short_options());
  asio::io_context ctx;
  run_coro(ctx, [&]() -> asio::awaitable<void> {
    std::error_code closed_with;
    auto c = co_await connect_to(srv.endpoint, short_options(), [&](std::error_code ec) { closed_with = ec; });
    asio::steady_timer t(ctx, 3 * short_timeout);
    co_await t.async_wait(asio::use_awaitable);
    BOOST_TEST(c->is_open(), "closed with: " << closed_with.message());
    const net::bytes p{std::byte{1}, std::byte{2}};
    auto r = co_await c->request(kind_echo, p, {}, corodist::deadline::after(10s));
    BOOST_TEST(!r.ec, r.ec.message());
    BOOST_TEST((r.msg.payload == p));
    c->close();
  }());
  auto kinds = corodist::test::on_loop(srv.loop, [&] { return *srv.kinds; });
  BOOST_TEST(kinds == std::vector<std::uint16_t>{kind_echo}, "the handler saw " << kinds.size() << " frames");
}

// Control frames sent by hand, one-way or not, are consumed by the
// connection: the handler sees only the echo that follows.
BOOST_AUTO_TEST_CASE(control_frames_are_never_delivered, *utf::timeout(60)) {
  local_server srv(short_options());
  asio::io_context ctx;
  tcp::socket s(ctx);
  s.connect(srv.endpoint);
  auto h = net::encode(net::hello{});
  asio::write(s, asio::buffer(h));
  std::array<std::byte, net::hello_size> back;
  asio::read(s, asio::buffer(back));
  BOOST_REQUIRE(net::decode_hello(back.data()).version == net::protocol_version);
  auto frame = [](std::uint16_t kind, std::uint16_t flags, std::uint64_t id) {
    return net::encode(net::frame_header{0, kind, flags, id});
  };
  for (auto f : {frame(net::control_kind, net::frame_flags::one_way, 0), frame(net::control_kind, 0, 7),
                 frame(kind_echo, 0, 8)})
    asio::write(s, asio::buffer(f));
  // The echo's response (heartbeats from the server may come before it).
  for (;;) {
    std::array<std::byte, net::header_size> hb;
    corodist::test::receive_all(s, hb.data(), hb.size());
    auto got = net::decode_header(hb.data());
    BOOST_REQUIRE(got.payload_len == 0u);
    if (got.kind == net::control_kind)
      continue;
    BOOST_TEST(got.kind == kind_echo);
    BOOST_TEST(got.request_id == 8u);
    break;
  }
  auto kinds = corodist::test::on_loop(srv.loop, [&] { return *srv.kinds; });
  BOOST_TEST(kinds == std::vector<std::uint16_t>{kind_echo});
}

// A client that says hello and then nothing (a host behind a partition looks
// the same: no byte, no FIN, no reset) is dropped by the server with
// peer_timed_out; the server's heartbeats to it do not keep it.
BOOST_AUTO_TEST_CASE(silent_peer_is_dropped, *utf::timeout(60)) {
  local_server srv(short_options());
  std::promise<std::error_code> dropped;
  corodist::test::on_loop(srv.loop, [&] { srv.on_closed = [&](std::error_code ec) { dropped.set_value(ec); }; });
  asio::io_context ctx;
  tcp::socket s(ctx);
  s.connect(srv.endpoint);
  auto h = net::encode(net::hello{});
  asio::write(s, asio::buffer(h));
  auto f = dropped.get_future();
  BOOST_REQUIRE(f.wait_for(30s) == std::future_status::ready);
  auto ec = f.get();
  BOOST_TEST((ec == net::errc::peer_timed_out), ec.message());
  BOOST_TEST(closed_by_peer(s, 10s));
}

// A peer process stopped with SIGSTOP (its kernel still acknowledges what it
// is sent) fails the pending request with peer_timed_out; a peer killed with
// SIGKILL fails it with connection_closed. Both surface as connection_error.
BOOST_AUTO_TEST_CASE(stopped_and_killed_peer_processes_are_detected, *utf::timeout(120)) {
  pipe_pair p1, p2;
  child_process stopped(server_body(p1.write_end()));
  child_process killed(server_body(p2.write_end()));
  const std::uint16_t stopped_port = read_port(p1), killed_port = read_port(p2);
  asio::io_context ctx;
  run_coro(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::error_code stopped_closed, killed_closed;
        auto a = co_await connect_to({asio::ip::make_address("127.0.0.1"), stopped_port}, short_options(),
                                     [&](std::error_code ec) { stopped_closed = ec; });
        auto b = co_await connect_to({asio::ip::make_address("127.0.0.1"), killed_port}, short_options(),
                                     [&](std::error_code ec) { killed_closed = ec; });
        // Idle for longer than peer_timeout first: the children's heartbeats keep both open.
        asio::steady_timer t(ctx, 2 * short_timeout);
        co_await t.async_wait(asio::use_awaitable);
        BOOST_REQUIRE(a->is_open());
        BOOST_REQUIRE(b->is_open());

        std::optional<net::response> ra, rb;
        asio::steady_timer both(ctx, std::chrono::steady_clock::time_point::max());
        auto pend = [&](std::shared_ptr<net::connection> c, std::optional<net::response>& out) {
          asio::co_spawn(
              ctx,
              [&, c]() -> asio::awaitable<void> {
                auto r = co_await c->request(kind_hold, {}, {}, corodist::deadline::never()); // no deadline
                out = std::move(r);
                if (ra && rb)
                  both.cancel();
              },
              asio::detached);
        };
        pend(a, ra);
        pend(b, rb);
        ::kill(stopped.pid(), SIGSTOP);
        ::kill(killed.pid(), SIGKILL);
        co_await both.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        BOOST_TEST((ra->ec == net::errc::peer_timed_out), ra->ec.message());
        BOOST_TEST((stopped_closed == net::errc::peer_timed_out), stopped_closed.message());
        BOOST_TEST((rb->ec == net::errc::connection_closed), rb->ec.message());
        BOOST_TEST(!a->is_open());
        BOOST_TEST(!b->is_open());
        BOOST_CHECK_THROW(net::throw_net_error(ra->ec, "request"), corodist::connection_error);
        BOOST_CHECK_THROW(net::throw_net_error(rb->ec, "request"), corodist::connection_error);
      }(),
      60s);
  ::kill(stopped.pid(), SIGCONT);
}

// The connections of one loop share its heartbeat wheels (one per
// peer_timeout): with two timeouts in use and every third connection closed
// at once (holes in the wheels), each connection left stays open through three
// peer_timeouts of silence and answers; no heartbeat reaches a handler; and
// once every connection has closed the loop has no work left (no timer is
// kept armed for nobody).
BOOST_AUTO_TEST_CASE(connections_of_a_loop_share_its_heartbeats, *utf::timeout(60)) {
  auto longer = short_options();
  longer.peer_timeout = 2 * short_timeout;
  local_server srv(short_options()), srv_longer(longer);
  constexpr std::size_t count = 30;
  asio::io_context ctx;
  run_coro(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<std::shared_ptr<net::connection>> conns;
        for (std::size_t i = 0; i < count; ++i) {
          // (Named first: GCC 12 miscompiles temporaries and ?: inside a co_await expression.)
          const bool to_longer = i % 4 == 0;
          const tcp::endpoint ep = to_longer ? srv_longer.endpoint : srv.endpoint;
          const net::connection_options opts = to_longer ? longer : short_options();
          auto c = co_await connect_to(ep, opts);
          conns.push_back(std::move(c));
        }
        for (std::size_t i = 0; i < count; i += 3)
          conns[i]->close();
        asio::steady_timer t(ctx, 3 * longer.peer_timeout.length());
        co_await t.async_wait(asio::use_awaitable);
        const net::bytes p{std::byte{7}};
        for (std::size_t i = 0; i < count; ++i) {
          if (i % 3 == 0)
            continue;
          BOOST_TEST_REQUIRE(conns[i]->is_open(), "connection " << i << " closed");
          auto r = co_await conns[i]->request(kind_echo, p, {}, corodist::deadline::after(10s));
          BOOST_TEST(!r.ec, r.ec.message());
        }
        for (auto& c : conns)
          c->close();
      }(),
      60s);
  ctx.restart();
  ctx.run_for(10s); // returns at once when nothing is left to run
  BOOST_TEST(ctx.stopped(), "work was left on the loop after every connection had closed");
  auto kinds = corodist::test::on_loop(srv.loop, [&] { return *srv.kinds; });
  auto kinds_longer = corodist::test::on_loop(srv_longer.loop, [&] { return *srv_longer.kinds; });
  kinds.insert(kinds.end(), kinds_longer.begin(), kinds_longer.end());
  BOOST_TEST(kinds == std::vector<std::uint16_t>(count - count / 3, kind_echo),
             "the handlers saw " << kinds.size() << " frames");
}

// Connections whose peer goes silent are closed by the heartbeat wheel's
// turn (peer_timed_out), and each one's close handler closes a partner
// connection on the same wheel, in the middle of that turn: every connection
// ends with its own reason, and the loop is left with no work.
BOOST_AUTO_TEST_CASE(connections_closed_during_a_heartbeat_turn, *utf::timeout(60)) {
  local_server srv(short_options());
  asio::io_context ctx;
  silent_server quiet(ctx);
  constexpr std::size_t pairs = 12;
  std::vector<std::error_code> silent_closed(pairs), partner_closed(pairs);
  run_coro(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<std::shared_ptr<net::connection>> partners(pairs), silent(pairs);
        std::size_t closed = 0;
        asio::steady_timer all_closed(ctx, std::chrono::steady_clock::time_point::max());
        const auto opts = short_options();
        const auto quiet_endpoint = quiet.endpoint();
        for (std::size_t i = 0; i < pairs; ++i) {
          partners[i] = co_await connect_to(srv.endpoint, opts, [&, i](std::error_code ec) { partner_closed[i] = ec; });
          silent[i] = co_await connect_to(quiet_endpoint, opts, [&, i](std::error_code ec) {
            silent_closed[i] = ec;
            partners[i]->close();
            if (++closed == pairs)
              all_closed.cancel();
          });
        }
        co_await all_closed.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        for (std::size_t i = 0; i < pairs; ++i) {
          BOOST_TEST(!partners[i]->is_open());
          BOOST_TEST(!silent[i]->is_open());
        }
      }(),
      30s);
  for (std::size_t i = 0; i < pairs; ++i) {
    BOOST_TEST((silent_closed[i] == net::errc::peer_timed_out), i << ": " << silent_closed[i].message());
    BOOST_TEST((partner_closed[i] == net::errc::connection_closed), i << ": " << partner_closed[i].message());
  }
  quiet.close();
  ctx.restart();
  ctx.run_for(10s); // returns at once when nothing is left to run
  BOOST_TEST(ctx.stopped(), "work was left on the loop after every connection had closed");
}

// peer_timeout's default comes from CORODIST_PEER_TIMEOUT_MS when it is set.
BOOST_AUTO_TEST_CASE(default_peer_timeout_comes_from_the_environment, *utf::timeout(10)) {
  const char* old = std::getenv("CORODIST_PEER_TIMEOUT_MS");
  const std::string saved = old ? old : "";
  ::unsetenv("CORODIST_PEER_TIMEOUT_MS");
  BOOST_TEST(net::connection_options{}.peer_timeout == net::connection_options::default_peer_timeout);
  ::setenv("CORODIST_PEER_TIMEOUT_MS", "750", 1);
  BOOST_TEST(net::connection_options{}.peer_timeout == 750ms);
  ::setenv("CORODIST_PEER_TIMEOUT_MS", "0", 1);
  BOOST_TEST(net::connection_options{}.peer_timeout == corodist::timeout::never()); // 0: off
  ::setenv("CORODIST_PEER_TIMEOUT_MS", "soon", 1);
  BOOST_TEST(net::configured_peer_timeout() == net::connection_options::default_peer_timeout);
  if (old)
    ::setenv("CORODIST_PEER_TIMEOUT_MS", saved.c_str(), 1);
  else
    ::unsetenv("CORODIST_PEER_TIMEOUT_MS");
}

BOOST_AUTO_TEST_SUITE_END()
