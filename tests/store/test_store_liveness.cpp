// Failure detection between store clients and the server (peer_timeout on
// their connections): a client process that hangs is dropped by the server
// with its waits; a server process that hangs fails its clients' pending
// waits with connection_error; PyTorch-protocol clients, which send no
// heartbeats, are not subject to it. Linked into the store test executable.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/connect_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <csignal>
#include <string>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::pipe_pair;

namespace {

constexpr auto short_timeout = 400ms;

cs::tcp_store_options client_opts(std::uint16_t port, cs::wire_protocol protocol = cs::wire_protocol::native) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  o.protocol = protocol;
  o.connection.peer_timeout = short_timeout;
  return o;
}

std::shared_ptr<cs::store_server> start_server(event_loop& loop) {
  cs::server_options so;
  so.auth_token = "";
  so.peer_timeout = short_timeout;
  return cs::store_server::start(loop.get_executor(), so);
}

} // namespace

BOOST_AUTO_TEST_SUITE(store_liveness)

// A client process stopped (SIGSTOP) with a wait pending at the server: the
// server drops it -- its connection and its wait -- once it has been silent
// for peer_timeout, and keeps serving the others.
BOOST_AUTO_TEST_CASE(stopped_client_is_dropped_by_the_server, *utf::timeout(60)) {
  event_loop server_loop;
  server_loop.start();
  auto srv = start_server(server_loop);
  const std::uint16_t port = srv->local_endpoint().port();
  child_process client([port]() -> int {
    event_loop l;
    l.start();
    cs::sync_store s(cs::tcp_store::connect_sync(l.get_executor(), client_opts(port)));
    s.set("client", "here");
    s.wait({"never"}, 30s); // pending at the server when it is stopped
    return 0;
  });
  const bool waiting =
      corodist::run_blocking(server_loop.get_executor(), srv->wait_until([&] { return srv->pending_waits() == 1; }, 20s));
  BOOST_REQUIRE(waiting);
  ::kill(client.pid(), SIGSTOP);
  const bool dropped = corodist::run_blocking(
      server_loop.get_executor(),
      srv->wait_until([&] { return srv->connection_count() == 0 && srv->pending_waits() == 0; }, 30s));
  BOOST_TEST(dropped);
  // The others are served as before.
  event_loop loop;
  loop.start();
  cs::sync_store other(cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port)));
  BOOST_TEST(other.get("client") == "here");
}

// A server process stopped (SIGSTOP) while a client's wait is pending there:
// the wait fails with connection_error naming the server's address (not
// timeout_error at its 20 s deadline), and so does the next operation.
BOOST_AUTO_TEST_CASE(stopped_server_fails_pending_waits, *utf::timeout(60)) {
  corodist::test::server_with_a_pending_wait job(
      [](event_loop& l) { return start_server(l); },
      [](event_loop& l, std::uint16_t port) {
        auto s = cs::tcp_store::connect_sync(l.get_executor(), client_opts(port));
        cs::sync_store(s).set("a", "1");
        return s;
      },
      [](std::shared_ptr<cs::tcp_store> s) -> asio::awaitable<void> {
        std::vector<std::string> keys{"never"};
        co_await s->wait(std::move(keys), 20s);
      });
  std::string what = job.fail_with(SIGSTOP);
  BOOST_TEST(what.find("127.0.0.1:" + std::to_string(job.port)) != std::string::npos, what);
  BOOST_TEST(what.find("peer_timeout") != std::string::npos, what);
  BOOST_CHECK_THROW(cs::sync_store(job.client).set("b", "2"), corodist::connection_error);
  ::kill(job.server->pid(), SIGCONT);
}

// PyTorch TCPStore clients send no heartbeats: the server does not drop them
// for being quiet longer than its peer_timeout (both protocol versions).
BOOST_AUTO_TEST_CASE(pytorch_clients_are_not_subject_to_the_heartbeat, *utf::timeout(60)) {
  event_loop server_loop;
  server_loop.start();
  auto srv = start_server(server_loop);
  const std::uint16_t port = srv->local_endpoint().port();
  event_loop loop;
  loop.start();
  cs::sync_store v1(cs::connect_store_sync(loop.get_executor(), client_opts(port, cs::wire_protocol::pytorch_1_13)));
  cs::sync_store v2(cs::connect_store_sync(loop.get_executor(), client_opts(port, cs::wire_protocol::pytorch_2)));
  v1.set("k1", "a");
  v2.set("k2", "b");
  const auto connected = corodist::run_blocking(server_loop.get_executor(), [&]() -> asio::awaitable<std::size_t> {
    co_return srv->connection_count();
  }());
  // Quiet for three times the server's peer_timeout (a timer, not a guess).
  corodist::run_blocking(loop.get_executor(), [&]() -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor, 3 * short_timeout);
    co_await t.async_wait(asio::use_awaitable);
  }());
  const auto still = corodist::run_blocking(server_loop.get_executor(), [&]() -> asio::awaitable<std::size_t> {
    co_return srv->connection_count();
  }());
  BOOST_TEST(still == connected);
  BOOST_TEST(v1.get("k2") == "b");
  BOOST_TEST(v2.get("k1") == "a");
}

BOOST_AUTO_TEST_SUITE_END()
