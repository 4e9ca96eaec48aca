// store_server + tcp_store specifics: connecting, many clients, authentication,
// bad input and server death.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/store/connect_store.hpp>
#include <corodist/store/sync_store.hpp>

#include "store/log_capture.hpp"
#include "store/sized_allocations.hpp"
#include "store/store_fixtures.hpp"
#include "store/wire/torch/query.hpp"
#include "support/cancel.hpp"
#include "support/child_process.hpp"
#include "support/coro_test.hpp"
#include "support/free_port.hpp"
#include "support/loop_helpers.hpp"
#include "support/program.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_future.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <csignal>
#include <cstdlib>
#include <future>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <tuple>
#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
namespace net = corodist::net;
using asio::ip::tcp;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::closed_by_peer;
using corodist::test::free_port;
using corodist::test::on_loop;
using corodist::test::server_reaches;
using corodist::test::receive_all;
using corodist::test::send_all;

namespace {

cs::tcp_store_options client_opts(std::uint16_t port, std::optional<std::string> token = std::string()) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = std::move(token);
  o.timeout = 10s;
  return o;
}

std::shared_ptr<cs::store_server> start_server(event_loop& loop, std::optional<std::string> token = std::string(),
                                               std::uint16_t port = 0) {
  cs::server_options so;
  so.port = port;
  so.auth_token = std::move(token);
  so.handshake_timeout = 500ms;
  return cs::store_server::start(loop.get_executor(), so);
}



// A raw socket that has completed the native hello.
tcp::socket raw_client(asio::io_context& ctx, std::uint16_t port) {
  tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  auto h = net::encode(net::hello{});
  send_all(s, std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
  std::array<std::byte, net::hello_size> back;
  receive_all(s, back.data(), back.size());
  return s;
}

void send_frame(tcp::socket& s, std::uint16_t kind, std::uint64_t id, const std::string& payload) {
  auto h = net::encode(net::frame_header{static_cast<std::uint32_t>(payload.size()), kind, 0, id});
  send_all(s, std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
  send_all(s, payload);
}

std::pair<net::frame_header, std::string> read_frame(tcp::socket& s) {
  std::array<std::byte, net::header_size> hb;
  receive_all(s, hb.data(), hb.size());
  auto h = net::decode_header(hb.data());
  std::string body(h.payload_len, '\0');
  receive_all(s, body.data(), body.size());
  return {h, body};
}

// True once `acceptor` has a connection waiting, within `limit`.
bool connection_arrives(tcp::acceptor& acceptor, std::chrono::milliseconds limit) {
  pollfd p{acceptor.native_handle(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

} // namespace

BOOST_AUTO_TEST_SUITE(tcp_client_server)

// The client's first attempt reaches a listener that closes without
// accepting it (a failed attempt, observed); the client goes on trying, and
// connects to the real server that then comes up on the same port.
BOOST_AUTO_TEST_CASE(connect_retries_until_the_server_appears, *utf::timeout(60)) {
  asio::io_context ctx;
  tcp::acceptor gate(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = gate.local_endpoint().port();
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto o = client_opts(port);
  auto connecting = asio::co_spawn(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), o), asio::use_future);
  BOOST_REQUIRE(connection_arrives(gate, 10s));
  gate.close(); // resets the attempt it never accepted; later ones are refused
  BOOST_TEST((connecting.wait_for(0s) == std::future_status::timeout), "the client is still trying");
  auto server = start_server(server_loop, std::string(), port);
  auto s = connecting.get();
  cs::sync_store(s).set("k", "v");
  BOOST_TEST(cs::sync_store(s).get("k") == "v");
}

// A server swamped by a connect storm may close connections before its hello:
// the client retries them like refused connects. A gate closes the client's
// first attempt after reading its hello (the client reads EOF: closed_before_hello)
// and its second at once; the third attempt, arriving, shows the client went
// on, and it then connects to the real server on the gate's port.
BOOST_AUTO_TEST_CASE(connect_retries_connections_closed_before_the_hello, *utf::timeout(60)) {
  asio::io_context ctx;
  tcp::acceptor gate(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = gate.local_endpoint().port();
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto o = client_opts(port);
  auto connecting = asio::co_spawn(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), o), asio::use_future);
  for (int i = 0; i < 2; ++i) {
    BOOST_REQUIRE_MESSAGE(connection_arrives(gate, 10s), "attempt " << i + 1 << " arrives");
    tcp::socket s(ctx);
    gate.accept(s);
    if (i == 0) { // read the hello first: the close then ends the connection (EOF), not resets it
      std::array<std::byte, net::hello_size> hello;
      receive_all(s, hello.data(), hello.size());
    }
    s.close();
  }
  BOOST_REQUIRE_MESSAGE(connection_arrives(gate, 10s), "a third attempt arrives");
  BOOST_TEST((connecting.wait_for(0s) == std::future_status::timeout), "the client is still trying");
  gate.close();
  auto server = start_server(server_loop, std::string(), port);
  auto c = connecting.get();
  cs::sync_store(c).set("k", "v");
  BOOST_TEST(cs::sync_store(c).get("k") == "v");
}

// A server that answers the hello with something else is no store server:
// the client fails at once with protocol_error, no retries until its timeout.
BOOST_AUTO_TEST_CASE(connect_to_a_server_that_sends_garbage_fails_at_once, *utf::timeout(60)) {
  asio::io_context ctx;
  tcp::acceptor gate(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  event_loop loop;
  loop.start();
  auto o = client_opts(gate.local_endpoint().port());
  o.timeout = 30s; // a retry would run into the test's limit, not fail at once
  auto connecting = asio::co_spawn(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), o), asio::use_future);
  BOOST_REQUIRE(connection_arrives(gate, 10s));
  tcp::socket s(ctx);
  gate.accept(s);
  send_all(s, "HTTP/1.1 400 Bad Request\r\n\r\n");
  BOOST_REQUIRE((connecting.wait_for(20s) == std::future_status::ready));
  try {
    connecting.get();
    BOOST_FAIL("connected to a server that sends garbage");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("magic") != std::string::npos, e.what());
  }
}

// tcp_store_options::source_address: both clients connect from it (a gate
// sees it as the address of their first attempt, which it closes), then reach
// the real server started on the gate's port.
BOOST_AUTO_TEST_CASE(clients_connect_from_their_source_address, *utf::timeout(60)) {
  for (auto protocol : {cs::wire_protocol::native, cs::wire_protocol::pytorch_2}) {
    BOOST_TEST_CONTEXT("protocol " << static_cast<int>(protocol)) {
      asio::io_context ctx;
      tcp::acceptor gate(ctx, {asio::ip::make_address("127.0.0.1"), 0});
      const auto port = gate.local_endpoint().port();
      event_loop server_loop, loop;
      server_loop.start();
      loop.start();
      auto o = client_opts(port);
      o.protocol = protocol;
      o.source_address = "127.0.0.2";
      auto connecting =
          asio::co_spawn(loop.get_executor(), cs::connect_store(loop.get_executor(), o), asio::use_future);
      BOOST_REQUIRE(connection_arrives(gate, 10s));
      tcp::socket s(ctx);
      gate.accept(s);
      BOOST_TEST(s.remote_endpoint().address() == asio::ip::make_address("127.0.0.2"));
      s.close();
      gate.close();
      auto server = start_server(server_loop, std::string(), port);
      cs::sync_store c(connecting.get());
      c.set("k", "v");
      BOOST_TEST(c.get("k") == "v");
    }
  }
}

// A source_address that is no IP address, no address of this host, or of
// the other family than the server's is a usage_error, at once.
BOOST_AUTO_TEST_CASE(a_bad_source_address_is_a_usage_error, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  auto server = start_server(loop);
  for (auto protocol : {cs::wire_protocol::native, cs::wire_protocol::pytorch_2}) {
    for (const char* source : {"not-an-address", "192.0.2.1", "::1"}) {
      BOOST_TEST_CONTEXT("source_address " << source << ", protocol " << static_cast<int>(protocol)) {
        auto o = client_opts(server->local_endpoint().port());
        o.protocol = protocol;
        o.source_address = source;
        o.timeout = 30s;
        try {
          cs::connect_store_sync(loop.get_executor(), o);
          BOOST_FAIL("connected from " << source);
        } catch (const corodist::usage_error& e) {
          BOOST_TEST(std::string(e.what()).find("source_address") != std::string::npos, e.what());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(ipv6_loopback, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.host = "::1";
  so.auth_token = "";
  std::shared_ptr<cs::store_server> server;
  try {
    server = cs::store_server::start(server_loop.get_executor(), so);
  } catch (const corodist::connection_error& e) {
    BOOST_TEST_MESSAGE("no IPv6 loopback here, skipping: " << e.what());
    return;
  }
  BOOST_TEST(server->local_endpoint().address().is_v6());
  auto o = client_opts(server->local_endpoint().port());
  o.host = "::1";
  auto v6 = cs::tcp_store::connect_sync(loop.get_executor(), o);
  cs::sync_store(v6).set("six", "6");
  BOOST_TEST(v6->remote_endpoint().address().is_v6());
  BOOST_TEST(cs::sync_store(v6).get("six") == "6");
  // (Host names are covered by the env:// rendezvous test: MASTER_ADDR=localhost.)
}

// (How far past its deadline connect gives up is a benchmark figure:
// bench/store_suite.cpp, connect_timeout_overrun.)
BOOST_AUTO_TEST_CASE(connect_gives_up_at_the_timeout, *utf::timeout(60)) {
  auto port = free_port(); // nobody listens
  event_loop loop;
  loop.start();
  auto o = client_opts(port);
  o.timeout = 300ms;
  auto t0 = std::chrono::steady_clock::now();
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), o);
    BOOST_FAIL("connected to nothing");
  } catch (const corodist::timeout_error& e) {
    BOOST_TEST(std::string(e.what()).find("attempts") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("within 300 ms") != std::string::npos, e.what());
  }
  auto took = std::chrono::steady_clock::now() - t0;
  BOOST_CHECK(took >= 250ms);
}

// A client that cannot connect says so early (here after 50 ms; 5 s by
// default), naming where it connects and the last error, then keeps trying
// and connects once the server comes up. (Before, the first word came after 30 s.)
BOOST_AUTO_TEST_CASE(connecting_warns_early_saying_where_and_why, *utf::timeout(60)) {
  corodist::test::log_capture log;
  corodist::test::warning_schedule_for_test schedule(50ms, 1h);
  const auto port = free_port(); // nobody listens yet
  event_loop loop;
  loop.start();
  auto o = client_opts(port);
  o.timeout = 30s;
  auto connecting = asio::co_spawn(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), o), asio::use_future);
  auto warned = log.wait_for("still connecting to the store server at 127.0.0.1:" + std::to_string(port) + " after");
  BOOST_REQUIRE_EQUAL(warned.size(), 1u);
  BOOST_TEST(warned[0].find("last error: Connection refused (nothing listens there") != std::string::npos, warned[0]);
  BOOST_TEST(warned[0].find("gives up after 30 s") != std::string::npos, warned[0]);
  auto server = start_server(loop, std::string(), port);
  auto s = connecting.get();
  cs::sync_store(s).set("k", "v");
  BOOST_TEST(log.lines("still connecting").size() == 1u); // the next one is an hour away
}

// A get that lasts says so early (here after 50 ms; 5 s by default), naming
// its key and the server, and returns once the key is set.
BOOST_AUTO_TEST_CASE(a_long_get_warns_early_naming_its_key, *utf::timeout(60)) {
  corodist::test::log_capture log;
  corodist::test::warning_schedule_for_test schedule(50ms, 1h);
  event_loop loop;
  loop.start();
  auto server = start_server(loop);
  const auto port = server->local_endpoint().port();
  auto s = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  auto got = asio::co_spawn(loop.get_executor(), s->get("late/key", 30s), asio::use_future);
  auto warned = log.wait_for("still waiting for key late/key at 127.0.0.1:" + std::to_string(port) + " after");
  BOOST_REQUIRE_EQUAL(warned.size(), 1u);
  BOOST_TEST(warned[0].find("gives up after 30 s") != std::string::npos, warned[0]);
  cs::sync_store(s).set("late/key", "v");
  BOOST_TEST(got.get() == "v");
}

// With refused_retry_window, a server that refuses connections (nothing
// listens) is reported as such once the window has passed, long before the
// timeout; rendezvous leaves it unset and keeps retrying.
BOOST_AUTO_TEST_CASE(connect_reports_nothing_listening_after_its_window, *utf::timeout(60)) {
  const auto port = free_port();
  event_loop loop;
  loop.start();
  for (auto window : {0ms, 200ms}) {
    auto o = client_opts(port);
    o.timeout = 30s;
    o.refused_retry_window = window;
    auto t0 = std::chrono::steady_clock::now();
    try {
      cs::tcp_store::connect_sync(loop.get_executor(), o);
      BOOST_FAIL("connected to nothing");
    } catch (const corodist::connection_error& e) {
      const std::string what = e.what();
      BOOST_TEST(what.find("nothing is listening on 127.0.0.1:" + std::to_string(port)) != std::string::npos, what);
    }
    BOOST_CHECK(std::chrono::steady_clock::now() - t0 >= window);
  }
  // A PyTorch protocol is torch_store's (or connect_store's) business.
  auto o = client_opts(port);
  o.protocol = cs::wire_protocol::pytorch_2;
  BOOST_CHECK_THROW(cs::tcp_store::connect_sync(loop.get_executor(), o), corodist::usage_error);
}

namespace {
// build/tools/corodist-store, beside this test's build/tests/.
std::string store_tool() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return {};
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/')) + "/../tools/corodist-store";
}

boost::test_tools::assertion_result store_tool_built(utf::test_unit_id) {
  boost::test_tools::assertion_result r(::access(store_tool().c_str(), X_OK) == 0);
  if (!r)
    r.message() << "skipped: " << store_tool() << " was not built (CLI11 missing)";
  return r;
}
} // namespace

// corodist-store with nothing listening says so after its short window (1 s),
// not after its timeout, and logs each attempt at debug level.
BOOST_AUTO_TEST_CASE(store_tool_says_nothing_is_listening, *utf::precondition(store_tool_built) * utf::timeout(60)) {
  const auto port = std::to_string(free_port());
  corodist::test::program tool(
      {"env", "CORODIST_LOG=debug", store_tool(), "--port", port, "--timeout", "30", "--auth-token", "", "get", "k"});
  const int rc = tool.wait(20s);
  const auto& out = tool.output();
  BOOST_TEST(rc == 1, out);
  BOOST_TEST(out.find("nothing is listening on 127.0.0.1:" + port) != std::string::npos, out);
  BOOST_TEST(out.find("attempt 1 to connect to the store server at 127.0.0.1:" + port) != std::string::npos, out);
}

// corodist-store's command line: --version; the connection options after the
// command, in its --help, and --timeout 0 (keys awaited without deadline);
// negative timeouts and unknown commands refused, naming what is expected.
BOOST_AUTO_TEST_CASE(store_tool_command_line, *utf::precondition(store_tool_built) * utf::timeout(60)) {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), store_tool());
    corodist::test::program tool(args);
    const int rc = tool.wait(20s);
    return std::pair{rc, tool.output()};
  };
  auto [rc, out] = run({"--version"});
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out.find("corodist-store 0.") != std::string::npos, out);
  std::tie(rc, out) = run({"get", "--help"});
  BOOST_TEST(rc == 0, out);
  for (const char* opt : {"--host", "--port", "--auth-token", "--timeout", "--protocol"})
    BOOST_TEST(out.find(opt) != std::string::npos, "get --help lacks " << opt << ":\n" << out);
  std::tie(rc, out) = run({"--timeout", "-1", "get", "k"});
  BOOST_TEST(rc != 0, out);
  BOOST_TEST(out.find("not negative") != std::string::npos, out);
  std::tie(rc, out) = run({"frobnicate", "k"});
  BOOST_TEST(rc == 2, out);
  BOOST_TEST(out.find("unknown command 'frobnicate'") != std::string::npos, out);
  BOOST_TEST(out.find("serve, set, get, add, wait, keys, del") != std::string::npos, out);

  event_loop server_loop;
  server_loop.start();
  auto server = start_server(server_loop);
  const auto port = std::to_string(server->local_endpoint().port());
  std::tie(rc, out) = run({"set", "k", "v", "--port", port, "--auth-token", "", "--timeout", "0"});
  BOOST_TEST(rc == 0, out);
  std::tie(rc, out) = run({"get", "k", "--port", port, "--auth-token", "", "--timeout", "0"});
  BOOST_TEST(rc == 0, out);
  BOOST_TEST(out == "v\n", out);
}

BOOST_AUTO_TEST_CASE(thousand_concurrent_clients, *utf::timeout(180)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = start_server(server_loop);
  constexpr int n = 1000;
  auto port = server->local_endpoint().port();
  auto results = asio::co_spawn(
                     loop.get_executor(),
                     [&]() -> asio::awaitable<std::vector<std::shared_ptr<cs::tcp_store>>> {
                       std::vector<std::shared_ptr<cs::tcp_store>> clients(n);
                       int done = 0;
                       asio::steady_timer all(co_await asio::this_coro::executor,
                                              std::chrono::steady_clock::time_point::max());
                       std::exception_ptr failure;
                       for (int i = 0; i < n; ++i)
                         asio::co_spawn(
                             co_await asio::this_coro::executor,
                             [&, i]() -> asio::awaitable<void> {
                               try {
                                 auto o = client_opts(port);
                                 o.timeout = 60s;
                                 clients[i] = co_await cs::tcp_store::connect(co_await asio::this_coro::executor, o);
                                 (void)co_await clients[i]->add("count", 1);
                                 std::vector<std::string> keys{"count"};
                                 co_await clients[i]->wait(std::move(keys));
                               } catch (...) {
                                 failure = std::current_exception();
                               }
                               if (++done == n)
                                 all.cancel();
                             },
                             asio::detached);
                       co_await all.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
                       if (failure)
                         std::rethrow_exception(failure);
                       co_return clients;
                     }(),
                     asio::use_future)
                     .get();
  BOOST_TEST(on_loop(server_loop, [&] { return server->connection_count(); }) == std::size_t(n));
  BOOST_TEST(cs::sync_store(results[0]).get("count") == std::to_string(n));
}

BOOST_AUTO_TEST_CASE(authentication_accepted_and_refused, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = start_server(server_loop, std::string("s3cret"));
  auto port = server->local_endpoint().port();
  auto good = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port, "s3cret"));
  cs::sync_store(good).set("k", "v");
  BOOST_TEST(cs::sync_store(good).get("k") == "v");
  try { // refused at once: a retried refusal would end in timeout_error at the deadline
    cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port, "wrong"));
    BOOST_FAIL("a wrong token was accepted");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("authentication failed") != std::string::npos, e.what());
  }
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port, ""));
    BOOST_FAIL("a missing token was accepted");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("requires authentication") != std::string::npos, e.what());
  }
  // The token can come from the environment.
  ::setenv("CORODIST_AUTH_TOKEN", "s3cret", 1);
  auto from_env = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port, std::nullopt));
  ::unsetenv("CORODIST_AUTH_TOKEN");
  BOOST_TEST(cs::sync_store(from_env).get("k") == "v");
  // A raw client that skips the answer is dropped.
  asio::io_context ctx;
  auto raw = raw_client(ctx, port);
  BOOST_TEST(closed_by_peer(raw));
  BOOST_TEST(cs::sync_store(good).get("k") == "v");
}

// Pending waits are bounded in bytes per connection and for the server: a wait
// over a bound fails with a store_error naming the limit, the others stay
// pending, and what they held is released when their client goes.
// Authentication is mutual: a client that holds a token refuses a server that
// does not authenticate, and a server that replays another server's
// authentication (its nonce and proof) to a client is refused by the client,
// whose own nonce the replayed proof does not cover.
BOOST_AUTO_TEST_CASE(authentication_is_mutual, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto open_server = start_server(server_loop, std::string(""));
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), client_opts(open_server->local_endpoint().port(), "s3cret"));
    BOOST_FAIL("a client with a token talked to a server that does not authenticate");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("does not authenticate") != std::string::npos, e.what());
  }
  auto real = start_server(server_loop, std::string("s3cret"));
  // The relay: takes the real server's answer to a hello of its own, and hands
  // it to the client as if it were its own.
  asio::io_context ctx;
  tcp::acceptor relay(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  std::thread relay_thread([&] {
    tcp::socket up(ctx);
    up.connect({asio::ip::make_address("127.0.0.1"), real->local_endpoint().port()});
    net::hello mine;
    mine.flags = net::hello_flags::auth;
    mine.extension_len = 32;
    std::array<std::byte, 32> my_nonce{};
    auto hb = net::encode(mine);
    asio::write(up, asio::buffer(hb));
    asio::write(up, asio::buffer(my_nonce));
    std::array<std::byte, net::hello_size + 64> answer;
    asio::read(up, asio::buffer(answer)); // the real server's hello, nonce and proof
    tcp::socket victim(ctx);
    relay.accept(victim);
    std::array<std::byte, net::hello_size + 32> client_hello;
    asio::read(victim, asio::buffer(client_hello));
    asio::write(victim, asio::buffer(answer)); // replayed
    std::array<std::byte, 32> proof;
    std::error_code ec;
    asio::read(victim, asio::buffer(proof), ec);
    BOOST_TEST(ec, "the client answered a replayed proof");
  });
  try {
    cs::tcp_store::connect_sync(loop.get_executor(), client_opts(relay.local_endpoint().port(), "s3cret"));
    BOOST_FAIL("the client accepted a replayed proof");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("authentication failed") != std::string::npos, e.what());
  }
  relay_thread.join();
}

BOOST_AUTO_TEST_CASE(pending_waits_are_bounded_in_bytes, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  so.max_wait_bytes_per_connection = 2 << 20;
  so.max_wait_bytes = 3 << 20;
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  auto a = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  auto b = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  // 100 keys of 4 KiB each: ~0.8 MiB counted per wait (each key is held twice).
  auto keys = [](const std::string& tag) {
    std::vector<std::string> k;
    for (int i = 0; i < 100; ++i)
      k.push_back(tag + std::to_string(i) + std::string(4096, 'k'));
    return k;
  };
  auto start_wait = [&](std::shared_ptr<cs::tcp_store> s, std::string tag) {
    return asio::co_spawn(loop.get_executor(), s->wait(keys(tag), 30s), asio::use_future);
  };
  auto held = [&] { return on_loop(server_loop, [&] { return server->pending_wait_bytes(); }); };
  auto a1 = start_wait(a, "a1-");
  auto a2 = start_wait(a, "a2-");
  auto a3 = start_wait(a, "a3-"); // over the connection's 2 MiB
  try {
    a3.get();
    BOOST_FAIL("a third wait was accepted");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("over the limit") != std::string::npos, e.what());
  }
  const auto two = held();
  BOOST_TEST(two > std::size_t{1} << 20);
  auto b1 = start_wait(b, "b1-");
  auto b2 = start_wait(b, "b2-"); // b's first fits; this one passes the server's 3 MiB
  try {
    b2.get();
    BOOST_FAIL("the server's bound was not applied");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("server") != std::string::npos, e.what());
  }
  // The waits that fit are still pending, and complete normally.
  corodist::run_blocking(loop.get_executor(), a->set("unrelated", "x"));
  BOOST_TEST((a1.wait_for(0s) == std::future_status::timeout));
  for (auto& k : keys("b1-"))
    corodist::run_blocking(loop.get_executor(), b->set(k, "v"));
  b1.get();
  // A client that goes takes its waits' memory with it.
  a->close();
  b->close();
  BOOST_TEST(server_reaches(server_loop, *server, [&] { return server->pending_wait_bytes() == 0; }));
  BOOST_CHECK_THROW(a1.get(), corodist::connection_error);
  BOOST_CHECK_THROW(a2.get(), corodist::connection_error);
}

namespace {
// Keys of an odd length, so that the copies of them can be counted (a
// std::string of this length allocates length + 1 bytes).
constexpr std::size_t counted_key_size = 65'003;
// 300 of them: a wait that would hold about 39 MB, over the default 16 MiB per connection.
std::vector<std::string> oversized_wait_keys() {
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) {
    auto k = "refused/" + std::to_string(i) + "/";
    k.resize(counted_key_size, 'k');
    keys.push_back(std::move(k));
  }
  return keys;
}
} // namespace

// A wait over the connection's byte limit is refused with a store_error while
// its keys are still views into the frame: the server makes no copy of them
// (a copy is what kept the memory of refused waits resident). The connection
// serves on.
BOOST_AUTO_TEST_CASE(oversized_wait_is_refused_before_its_keys_are_copied, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  auto a = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(server->local_endpoint().port()));
  auto keys = oversized_wait_keys();
  corodist::test::count_allocations_of(counted_key_size + 1);
  auto refused = asio::co_spawn(loop.get_executor(), a->wait(std::move(keys), 30s), asio::use_future);
  try {
    refused.get();
    BOOST_FAIL("a wait over the connection's byte limit was accepted");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("over the limit") != std::string::npos, e.what());
  }
  // (At most one: the buffer the engine looks each key up through, reused; a copy of the keys would be 300.)
  BOOST_TEST(corodist::test::sized_allocations() <= 1u);
  BOOST_TEST(on_loop(server_loop, [&] { return server->pending_wait_bytes(); }) == 0u);
  cs::sync_store(a).set("after", "v");
  BOOST_TEST(cs::sync_store(a).get("after") == "v");
}

// The same on the PyTorch 1.13 protocol (no error reply there: the
// connection is closed), and other connections are unaffected.
BOOST_AUTO_TEST_CASE(oversized_torch_wait_is_refused_before_its_keys_are_copied, *utf::timeout(60)) {
  namespace t = cs::detail::torch;
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  auto other = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  std::string query;
  t::encode_query(t::version::v1, t::wait_query{oversized_wait_keys()}, query);
  asio::io_context ctx;
  tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  corodist::test::count_allocations_of(counted_key_size + 1);
  asio::write(s, asio::buffer(query));
  BOOST_TEST(closed_by_peer(s, 20s));
  BOOST_TEST(corodist::test::sized_allocations() <= 1u); // (as above)
  cs::sync_store(other).set("after", "v");
  BOOST_TEST(cs::sync_store(other).get("after") == "v");
}

// max_connections: connections over the limit are closed at once, the ones in
// place keep working, and room made by a client leaving is used again.
BOOST_AUTO_TEST_CASE(connection_limit_refuses_at_once, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  so.max_connections = 4;
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  std::vector<std::shared_ptr<cs::tcp_store>> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port)));
  asio::io_context ctx;
  for (int i = 0; i < 3; ++i) {
    tcp::socket extra(ctx);
    extra.connect({asio::ip::make_address("127.0.0.1"), port});
    BOOST_TEST(closed_by_peer(extra));
  }
  cs::sync_store(clients[0]).set("k", "v");
  BOOST_TEST(cs::sync_store(clients[3]).get("k") == "v");
  clients[0]->close();
  BOOST_TEST(server_reaches(server_loop, *server, [&] { return server->connection_count() == 3; }));
  auto again = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  BOOST_TEST(cs::sync_store(again).get("k") == "v");
}

// Silent connections (PyTorch 1.13's second one) are kept only up to
// max_silent_connections; further ones are closed, the data is untouched.
BOOST_AUTO_TEST_CASE(silent_connections_are_capped, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  so.handshake_timeout = 100ms;
  so.max_silent_connections = 3;
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  const auto port = server->local_endpoint().port();
  asio::io_context ctx;
  std::vector<tcp::socket> silent;
  for (int i = 0; i < 5; ++i) {
    silent.emplace_back(ctx);
    silent.back().connect({asio::ip::make_address("127.0.0.1"), port});
  }
  int closed = 0;
  for (auto& s : silent)
    closed += closed_by_peer(s, 1s);
  BOOST_TEST(closed == 2);
  BOOST_TEST(on_loop(server_loop, [&] { return server->connection_count(); }) == 3u);
  auto c = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  cs::sync_store(c).set("k", "v");
  BOOST_TEST(cs::sync_store(c).get("k") == "v");
}

BOOST_AUTO_TEST_CASE(server_survives_bad_input, *utf::timeout(120)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  so.max_key_size = 64;
  so.max_value_size = 1024;
  so.max_pending_waits = 2;
  so.max_buffered_output = 64 * 1024;
  so.handshake_timeout = 300ms;
  auto server = cs::store_server::start(server_loop.get_executor(), so);
  auto port = server->local_endpoint().port();
  auto good = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  cs::sync_store g(good);
  g.set("keep", "me");
  asio::io_context ctx;
  { // garbage instead of a hello
    tcp::socket s(ctx);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    send_all(s, "\x01\x02garbage garbage garbage");
    BOOST_TEST(closed_by_peer(s));
  }
  { // a frame longer than the server accepts
    auto s = raw_client(ctx, port);
    auto h = net::encode(net::frame_header{100u << 20, 1, 0, 1});
    send_all(s, std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
    BOOST_TEST(closed_by_peer(s));
  }
  { // an unknown operation gets an error frame; the connection stays usable
    auto s = raw_client(ctx, port);
    send_frame(s, 999, 7, "");
    auto [h, body] = read_frame(s);
    BOOST_TEST(h.request_id == 7u);
    BOOST_TEST((h.flags & net::frame_flags::error));
    BOOST_TEST(body.find("unknown store operation") != std::string::npos, body);
    BOOST_TEST(body.find("999") == std::string::npos, body); // never the operation's number
    // a truncated payload (SET with a key length pointing past the end)
    send_frame(s, 1, 8, std::string("\xff\x00\x00\x00", 4));
    auto [h2, body2] = read_frame(s);
    BOOST_TEST(h2.request_id == 8u);
    BOOST_TEST(body2.size() > 1u);
    BOOST_TEST(body2[0] == '\x02'); // status: error
    BOOST_TEST(body2.find("malformed") != std::string::npos, body2);
  }
  { // a client that disconnects in the middle of a wait
    auto s = raw_client(ctx, port);
    std::string p;
    std::uint32_t klen = 5;
    p.append(reinterpret_cast<const char*>(&klen), 4);
    p += "never";
    std::uint64_t timeout = 0;
    p.append(reinterpret_cast<const char*>(&timeout), 8);
    send_frame(s, 2, 1, p); // GET "never", wait forever
    s.close();
  }
  // Limits give clear errors.
  try {
    g.set(std::string(100, 'k'), "v");
    BOOST_FAIL("oversized key accepted");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("max_key_size") != std::string::npos, e.what());
  }
  try {
    g.set("k", std::string(2000, 'v'));
    BOOST_FAIL("oversized value accepted");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("max_value_size") != std::string::npos, e.what());
  }
  { // more pending waits than allowed on one connection
    auto waiter = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
    auto w1 = asio::co_spawn(loop.get_executor(), waiter->get("w1", 2s), asio::use_future);
    auto w2 = asio::co_spawn(loop.get_executor(), waiter->get("w2", 2s), asio::use_future);
    BOOST_REQUIRE(server_reaches(server_loop, *server, [&] { return server->pending_waits() == 2; }));
    BOOST_CHECK_THROW(cs::sync_store(waiter).get("w3", 2s), corodist::store::store_error);
    g.set("w1", "1");
    g.set("w2", "2");
    BOOST_TEST(w1.get() == "1");
    BOOST_TEST(w2.get() == "2");
  }
  { // a watcher that never reads is dropped once its output passes the cap
    tcp::socket s = raw_client(ctx, port);
    std::string p;
    std::uint32_t klen = 3;
    p.append(reinterpret_cast<const char*>(&klen), 4);
    p += "hot";
    std::uint64_t wid = 1;
    p.append(reinterpret_cast<const char*>(&wid), 8);
    send_frame(s, 13, 1, p); // WATCH "hot"
    auto [wh, wbody] = read_frame(s); // its reply: the watch is registered; we never read again
    BOOST_TEST(wh.request_id == 1u);
    BOOST_TEST(wbody == std::string(1, '\0')); // status ok
    int sockbuf = 4096;
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
    std::size_t conns = 0;
    for (int i = 0; i < 40 && conns != 1; ++i) { // bounded: at most 40 MB of events offered
      for (int j = 0; j < 1000; ++j)
        g.set("hot", std::string(1000, 'x'));
      conns = on_loop(server_loop, [&] { return server->connection_count(); });
    }
    BOOST_TEST(conns == 1u, "only the good client is left: the non-reading watcher was disconnected");
  }
  BOOST_TEST(g.get("keep") == "me");
  auto fresh = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  BOOST_TEST(cs::sync_store(fresh).get("keep") == "me");
}

// (How soon after the SIGKILL the get fails is a benchmark figure:
// bench/store_suite.cpp, server_death_to_error.)
BOOST_AUTO_TEST_CASE(client_fails_promptly_when_the_server_dies, *utf::timeout(60)) {
  corodist::test::server_with_a_pending_wait job(
      [](event_loop& l) { return start_server(l); },
      [](event_loop& l, std::uint16_t port) {
        auto s = cs::tcp_store::connect_sync(l.get_executor(), client_opts(port));
        cs::sync_store(s).set("a", "1");
        return s;
      },
      [](std::shared_ptr<cs::tcp_store> s) -> asio::awaitable<void> { co_await s->get("never", 20s); });
  auto killed = std::chrono::steady_clock::now();
  // connection_error, not timeout_error: the loss was noticed, not the 20 s deadline.
  job.fail_with(SIGKILL);
  auto took = std::chrono::steady_clock::now() - killed;
  BOOST_TEST_MESSAGE("pending get failed "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms after SIGKILL");
  BOOST_CHECK_THROW(cs::sync_store(job.client).set("b", "2"), corodist::connection_error);
  BOOST_TEST(job.server->wait_for(5s) == 128 + SIGKILL);
}

BOOST_AUTO_TEST_SUITE_END()

// Owned keys (store::set_owned): deleted by the server when the owner's
// connection closes, unless a later write took them over.
BOOST_AUTO_TEST_SUITE(owned_keys)

namespace {

/// A rank process: connects to the server on `port`, sets `key` owned, says
/// so on `ready`, and blocks until killed.
int owner_process(std::uint16_t port, const std::string& key, int ready_fd) {
  event_loop l;
  l.start();
  auto s = cs::tcp_store::connect_sync(l.get_executor(), client_opts(port));
  corodist::run_blocking(l.get_executor(), s->set_owned(key, "owner"), "set_owned");
  char byte = 'o';
  if (!corodist::test::write_all(ready_fd, &byte, 1))
    return 1;
  ::pause(); // until the parent kills it
  return 0;
}

} // namespace

// The owner is killed (-9): the server sees its connection end, deletes the
// key, and a watcher sees `deleted`; a get waiting on another key waits on.
BOOST_AUTO_TEST_CASE(deleted_when_the_owner_process_is_killed, *utf::timeout(60)) {
  event_loop server_loop;
  server_loop.start();
  auto srv = start_server(server_loop);
  const auto port = srv->local_endpoint().port();
  corodist::test::pipe_pair ready;
  child_process owner([&] {
    ready.close_read();
    return owner_process(port, "lease", ready.write_end());
  });
  ready.close_write();
  char byte = 0;
  BOOST_REQUIRE(corodist::test::read_all(ready.read_end(), &byte, 1));
  event_loop loop;
  loop.start();
  auto s = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  BOOST_TEST(cs::sync_store(s).get("lease") == "owner");
  auto w = corodist::run_blocking(loop.get_executor(), s->watch_key("lease"), "watch_key");
  auto other = asio::co_spawn(loop.get_executor(), s->get("other", 20s), asio::use_future);
  ::kill(owner.pid(), SIGKILL);
  BOOST_TEST(owner.wait_for(10s) == 128 + SIGKILL);
  auto e = corodist::run_blocking(loop.get_executor(), w.next(10s), "watch next");
  BOOST_TEST(static_cast<int>(e.type) == static_cast<int>(cs::watch_event::kind::deleted));
  BOOST_TEST(e.key == "lease");
  BOOST_TEST(!cs::sync_store(s).check({"lease"}));
  cs::sync_store(s).set("other", "here"); // the pending get was not disturbed
  BOOST_TEST(other.get() == "here");
}

// A plain set by another client takes the key over: the owner's death leaves it.
BOOST_AUTO_TEST_CASE(a_plain_set_takes_the_ownership_away, *utf::timeout(60)) {
  event_loop server_loop;
  server_loop.start();
  auto srv = start_server(server_loop);
  const auto port = srv->local_endpoint().port();
  corodist::test::pipe_pair ready;
  child_process owner([&] {
    ready.close_read();
    return owner_process(port, "lease", ready.write_end());
  });
  ready.close_write();
  char byte = 0;
  BOOST_REQUIRE(corodist::test::read_all(ready.read_end(), &byte, 1));
  event_loop loop;
  loop.start();
  auto s = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  cs::sync_store(s).set("lease", "taken");
  ::kill(owner.pid(), SIGKILL);
  BOOST_TEST(owner.wait_for(10s) == 128 + SIGKILL);
  // The server has dropped the owner's session once one client (this one) is left.
  BOOST_REQUIRE(corodist::run_blocking(server_loop.get_executor(), srv->clients_left(1, 10s), "clients_left"));
  BOOST_TEST(cs::sync_store(s).get("lease") == "taken");
}

// In one process: a client that closes loses its keys; set_owned by another
// client moves the ownership to it; a prefix_store over a tcp_store forwards.
BOOST_AUTO_TEST_CASE(closing_the_client_deletes_its_keys_and_set_owned_moves_them, *utf::timeout(60)) {
  event_loop server_loop;
  server_loop.start();
  auto srv = start_server(server_loop);
  const auto port = srv->local_endpoint().port();
  event_loop loop;
  loop.start();
  auto watcher = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  auto a = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  auto b = cs::tcp_store::connect_sync(loop.get_executor(), client_opts(port));
  auto pa = std::make_shared<cs::prefix_store>("job", a);
  corodist::run_blocking(loop.get_executor(), pa->set_owned("mine", "a"), "set_owned");
  corodist::run_blocking(loop.get_executor(), a->set_owned("moved", "a"), "set_owned");
  corodist::run_blocking(loop.get_executor(), b->set_owned("moved", "b"), "set_owned");
  BOOST_TEST(cs::sync_store(watcher).get("job/mine") == "a");
  auto w = corodist::run_blocking(loop.get_executor(), watcher->watch_key("job/mine"), "watch_key");
  a->close();
  auto e = corodist::run_blocking(loop.get_executor(), w.next(10s), "watch next");
  BOOST_TEST(static_cast<int>(e.type) == static_cast<int>(cs::watch_event::kind::deleted));
  BOOST_TEST(cs::sync_store(watcher).get("moved") == "b"); // b owns it now
  auto wm = corodist::run_blocking(loop.get_executor(), watcher->watch_key("moved"), "watch_key");
  b->close();
  e = corodist::run_blocking(loop.get_executor(), wm.next(10s), "watch next");
  BOOST_TEST(static_cast<int>(e.type) == static_cast<int>(cs::watch_event::kind::deleted));
  BOOST_TEST(e.key == "moved");
}

// Stores without connections of their own: file_store refuses; hash_store
// keeps the key as a plain set would (one handle: it lives with the store).
BOOST_AUTO_TEST_CASE(stores_without_owned_keys, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  corodist::test::temp_file file;
  auto f = std::make_shared<cs::file_store>(loop.get_executor(), file.path);
  BOOST_CHECK_THROW(corodist::run_blocking(loop.get_executor(), f->set_owned("k", "v"), "set_owned"),
                    corodist::usage_error);
  auto h = std::make_shared<cs::hash_store>(loop.get_executor());
  corodist::run_blocking(loop.get_executor(), h->set_owned("k", "v"), "set_owned");
  BOOST_TEST(cs::sync_store(h).get("k") == "v");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cancellation)

// A wait cancelled mid-flight (the server has registered it) ends with
// operation_aborted; the connection stays usable; the server keeps the wait
// until the key comes (the native protocol has no message that withdraws a
// wait), and the client drops that late answer.
BOOST_AUTO_TEST_CASE(a_cancelled_wait_ends_with_operation_aborted_and_the_store_stays_usable, *utf::timeout(60)) {
  event_loop server_loop, loop;
  server_loop.start();
  loop.start();
  auto server = start_server(server_loop);
  auto port = server->local_endpoint().port();
  auto store = corodist::run_blocking(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), client_opts(port)),
                                      "connect");
  asio::cancellation_signal cancel;
  auto ended = on_loop(loop, [&] {
    std::vector<std::string> keys{"never-yet"};
    return corodist::test::spawn_cancellable(loop.get_executor(), store->wait(std::move(keys), 60s), cancel);
  });
  BOOST_REQUIRE(corodist::run_blocking(server_loop.get_executor(),
                                       server->wait_until([&] { return server->pending_waits() == 1; }, 20s)));
  on_loop(loop, [&] { cancel.emit(asio::cancellation_type::terminal); });
  corodist::test::require_cancelled(ended);
  // The same store (and connection) goes on working.
  cs::sync_store s(store);
  s.set("k", "v");
  BOOST_TEST(s.get("k") == "v");
  BOOST_TEST(on_loop(server_loop, [&] { return server->pending_waits(); }) == 1u);
  s.set("never-yet", "now");
  BOOST_TEST(corodist::run_blocking(server_loop.get_executor(),
                                    server->wait_until([&] { return server->pending_waits() == 0; }, 20s)));
  BOOST_TEST(s.get("never-yet") == "now");
  BOOST_TEST(on_loop(server_loop, [&] { return server->connection_count(); }) == 1u);
}

// A get awaited from another executor than the store's (the operation hops
// to the store's executor) is cancelled as well.
BOOST_AUTO_TEST_CASE(a_cancelled_get_from_another_executor_ends_with_operation_aborted, *utf::timeout(60)) {
  event_loop server_loop, loop, caller_loop;
  server_loop.start();
  loop.start();
  caller_loop.start();
  auto server = start_server(server_loop);
  auto port = server->local_endpoint().port();
  auto store = corodist::run_blocking(loop.get_executor(), cs::tcp_store::connect(loop.get_executor(), client_opts(port)),
                                      "connect");
  asio::cancellation_signal cancel;
  auto ended = on_loop(caller_loop, [&] {
    return corodist::test::spawn_cancellable(caller_loop.get_executor(), store->get("later", 60s), cancel);
  });
  BOOST_REQUIRE(corodist::run_blocking(server_loop.get_executor(),
                                       server->wait_until([&] { return server->pending_waits() == 1; }, 20s)));
  on_loop(caller_loop, [&] { cancel.emit(asio::cancellation_type::terminal); });
  corodist::test::require_cancelled(ended);
  cs::sync_store s(store);
  s.set("later", "v");
  BOOST_TEST(s.get("later") == "v");
}

BOOST_AUTO_TEST_SUITE_END()
