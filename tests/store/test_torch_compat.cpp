// PyTorch TCPStore wire compatibility, with Debian's python3-torch (1.13) as
// the real peer: PyTorch clients, a gloo process group with DDP and PyTorch
// RPC against our server; our client against a PyTorch master; our client's
// 1.13 and 2.x modes against our server; and bad or unwanted first bytes.
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/store/connect_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/torch_store.hpp>

#include "store/store_fixtures.hpp"
#include "support/program.hpp"
#include "support/loop_helpers.hpp"

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/read.hpp>
#include <asio/use_future.hpp>
#include <asio/write.hpp>

#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
using asio::ip::tcp;
using corodist::event_loop;
using corodist::test::program;
using corodist::test::closed_by_peer;
using corodist::test::receive_all;
using corodist::test::send_all;
using corodist::test::on_loop;

namespace {

// The Python that has torch: Debian's, unless CORODIST_TEST_PYTHON says otherwise.
std::string python() {
  const char* p = std::getenv("CORODIST_TEST_PYTHON");
  return p ? p : "/usr/bin/python3";
}

const std::string job_script = CORODIST_SOURCE_DIR "/tests/store/pytorch/torch_job.py";

boost::test_tools::assertion_result torch_available(utf::test_unit_id) {
  static const bool ok = [] {
    program p({python(), "-c", "import torch.distributed"});
    return p.wait(60s) == 0;
  }();
  boost::test_tools::assertion_result r(ok);
  if (!ok)
    r.message() << "skipped: " << python() << " cannot import torch (install it: scripts/setup.sh --python)";
  return r;
}

std::shared_ptr<cs::store_server> start_server(event_loop& loop, bool torch = true) {
  cs::server_options so;
  so.torch_protocol = torch;
  so.handshake_timeout = 500ms;
  return cs::store_server::start(loop.get_executor(), so);
}

// A loop running a store server (PyTorch protocol on): the common test setup.
struct served {
  served() {
    loop.start();
    srv = start_server(loop);
    port = srv->local_endpoint().port();
  }
  /// Whether the server gets to `n` connected clients within `limit` (woken by each change, not polled).
  bool connections_reach(std::size_t n, std::chrono::milliseconds limit = 10s) {
    return corodist::test::server_reaches(loop, *srv, [&] { return srv->connection_count() == n; }, limit);
  }
  /// Whether the server gets to `n` pending waits within 10 s (woken by each change, not polled).
  bool pending_waits_reach(std::size_t n) {
    return corodist::test::server_reaches(loop, *srv, [&] { return srv->pending_waits() == n; });
  }
  std::size_t pending_waits() { return on_loop(loop, [&] { return srv->pending_waits(); }); }
  event_loop loop;
  std::shared_ptr<cs::store_server> srv;
  std::uint16_t port = 0;
};

cs::sync_store connect(event_loop& loop, std::uint16_t port, cs::wire_protocol protocol = cs::wire_protocol::native) {
  cs::tcp_store_options o;
  o.port = port;
  o.timeout = 10s;
  o.auth_token = "";
  o.protocol = protocol;
  return cs::sync_store(cs::connect_store_sync(loop.get_executor(), o));
}

// Runs torch_job.py MODE PORT [N] to the end; fails the test with its output unless it passed.
void run_job(const std::string& mode, std::uint16_t port, int n = 2) {
  program p({"timeout", "150", python(), job_script, mode, std::to_string(port), std::to_string(n)});
  int rc = p.wait(170s);
  BOOST_TEST_INFO("torch_job.py " << mode << " output:\n" << p.output());
  BOOST_TEST(rc == 0);
  BOOST_TEST(p.output().find("OK") != std::string::npos);
}

tcp::socket raw_socket(asio::io_context& ctx, std::uint16_t port) {
  tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  return s;
}

// PyTorch 1.13's SET query: code 0, then u64-length key and value.
std::string v1_set(const std::string& k, const std::string& v) {
  std::string q(1, '\0');
  auto put = [&](const std::string& s) {
    std::uint64_t n = s.size();
    q.append(reinterpret_cast<const char*>(&n), 8);
    q += s;
  };
  put(k);
  put(v);
  return q;
}

// A raw PyTorch 2.x client: VALIDATE + PING done, reads time out after 5 s.
struct v2_socket {
  tcp::socket s;
  v2_socket(asio::io_context& ctx, std::uint16_t port) : s(raw_socket(ctx, port)) {
    timeval tv{5, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string q;
    u8(q, 0).u32(q, 0x3C85F7CE);
    u8(q, 13).u32(q, 0xABCD1234); // PING
    send(q);
    BOOST_TEST(read_u32() == 0xABCD1234u);
  }
  v2_socket& u8(std::string& q, std::uint8_t v) {
    q += static_cast<char>(v);
    return *this;
  }
  v2_socket& u32(std::string& q, std::uint32_t v) {
    q.append(reinterpret_cast<const char*>(&v), 4);
    return *this;
  }
  static std::string bytes(const std::string& b) {
    std::uint64_t n = b.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + b;
  }
  void send(const std::string& q) { send_all(s, q); }
  template <typename T>
  T read() {
    T v{};
    receive_all(s, &v, sizeof v);
    return v;
  }
  std::uint32_t read_u32() { return read<std::uint32_t>(); }
  std::string read_bytes() {
    std::string v(read<std::uint64_t>(), '\0');
    receive_all(s, v.data(), v.size());
    return v;
  }
};

// Every operation through one client; keys under `ns`.
void exercise(cs::sync_store& s, const std::string& ns, bool v2) {
  s.set(ns + "k", std::string("v\0x", 3));
  BOOST_TEST(s.get(ns + "k") == std::string("v\0x", 3));
  BOOST_TEST(s.add(ns + "n", 5) == 5);
  BOOST_TEST(s.add(ns + "n", -7) == -2);
  BOOST_TEST(s.get(ns + "n") == "-2");
  BOOST_TEST(s.compare_set(ns + "k", "nope", "x") == std::string("v\0x", 3));
  BOOST_TEST(s.compare_set(ns + "k", std::string("v\0x", 3), "y") == "y");
  BOOST_TEST(s.compare_set(ns + "absent", "e", "d") == "e");
  BOOST_TEST(s.check({ns + "k", ns + "n"}));
  BOOST_TEST(!s.check({ns + "k", ns + "zz"}));
  s.wait({ns + "k"}, 1s);
  BOOST_CHECK_THROW(s.wait({ns + "never"}, 200ms), corodist::timeout_error);
  // The connection is still good after a timed-out wait (2.x cancels it; 1.13 reconnects).
  BOOST_TEST(s.get(ns + "k") == "y");
  BOOST_CHECK_THROW(s.get(ns + "never", 200ms), corodist::timeout_error);
  s.multi_set({ns + "a", ns + "b"}, {"A", "B"});
  BOOST_TEST((s.multi_get({ns + "a", ns + "b"}) == std::vector<std::string>{"A", "B"}));
  if (v2) {
    s.append(ns + "a", "+");
    BOOST_TEST(s.get(ns + "a") == "A+");
  } else {
    BOOST_CHECK_THROW(s.append(ns + "a", "+"), corodist::store::store_error);
  }
  BOOST_TEST(s.num_keys() >= 4);
  BOOST_TEST(s.delete_key(ns + "b"));
  BOOST_TEST(!s.delete_key(ns + "b"));
  BOOST_CHECK_THROW(s.list_keys(), corodist::store::store_error);
  BOOST_CHECK_THROW(s.watch_key(ns + "k"), corodist::store::store_error);
}

} // namespace

BOOST_AUTO_TEST_SUITE(pytorch_compat)

BOOST_FIXTURE_TEST_CASE(pytorch_clients_do_every_operation_at_once, served, *utf::precondition(torch_available) *
                                                                     utf::timeout(200)) {
  auto native = connect(loop, port);
  native.set("/from_native", "hello from corodist"); // PyTorch's get("from_native")
  run_job("ops", port, 4);
  // The keys PyTorch's clients wrote, as a native client sees them ("/" prefix).
  BOOST_TEST(native.get("/counter", 1s) == "40");
  BOOST_TEST(native.get("/w3/c", 1s) == "5");
  for (int i = 0; i < 4; ++i)
    BOOST_TEST(native.get("/from_py/" + std::to_string(i), 1s) == "hello from pytorch");
  // Each PyTorch 1.13 client counted itself in "init/".
  BOOST_TEST(native.get("init/", 1s) == "4");
  // The clients are gone, with their timed-out waits.
  BOOST_TEST(connections_reach(1, 5s));
  BOOST_TEST(pending_waits() == 0u);
}

BOOST_FIXTURE_TEST_CASE(pytorch_gloo_process_group_and_ddp_step, served, *utf::precondition(torch_available) *
                                                                  utf::timeout(200)) {
  run_job("ddp", port);
}

BOOST_FIXTURE_TEST_CASE(pytorch_rpc_initialised_through_our_server, served, *utf::precondition(torch_available) *
                                                                     utf::timeout(200)) {
  run_job("rpc", port);
  // torchelastic's agent-store layout: PyTorch RPC's keys under /worker/attempt_0/.
  BOOST_TEST(on_loop(loop, [&] { return srv->key_count(); }) > 2u);
}

namespace {

// Runs torch_job.py edges against `port` (0: a PyTorch 1.13 master of its
// own); returns its lines before "OK".
std::vector<std::string> edge_answers(std::uint16_t port) {
  program p({"timeout", "150", python(), job_script, "edges", std::to_string(port)});
  std::vector<std::string> lines;
  while (auto line = p.read_line(120s)) {
    if (*line == "OK")
      break;
    lines.push_back(*line);
  }
  int rc = p.wait(60s);
  BOOST_TEST_INFO("torch_job.py edges output:\n" << p.output());
  BOOST_TEST(rc == 0);
  return lines;
}

} // namespace

// ADD as PyTorch 1.13's master does it, the same client calls against both:
// a stored value read as std::stoll reads it ("12abc" is 12, " 7" is 7, "+5"
// is 5), a sum past INT64_MAX wraps, and a value with no integer in it (or
// one outside int64) closes the connection on both.
BOOST_AUTO_TEST_CASE(add_edge_cases_answer_as_pytorch_master, *utf::precondition(torch_available) * utf::timeout(300)) {
  served s;
  const auto ours = edge_answers(s.port);
  const auto theirs = edge_answers(0);
  BOOST_TEST(theirs.size() == 11u);
  BOOST_TEST(ours == theirs, boost::test_tools::per_element());
  auto has = [&](const std::string& line) { return std::find(ours.begin(), ours.end(), line) != ours.end(); };
  BOOST_TEST(has("add '12abc' 1: 13 b'13'"));
  BOOST_TEST(has("add '9223372036854775807' 1: -9223372036854775808 b'-9223372036854775808'"));
  BOOST_TEST(has("add 'abc' 1: error"));
  // The native protocol stays strict.
  auto native = connect(s.loop, s.port);
  native.set("edge/native", "12abc");
  BOOST_CHECK_THROW(native.add("edge/native", 1), cs::store_error);
  native.set("edge/native", "9223372036854775807");
  BOOST_CHECK_THROW(native.add("edge/native", 1), cs::store_error);
}

// A COMPARE_SET that creates a key wakes no WAIT on it, as in PyTorch's
// master (1.13 and 2.x); the key is there for later WAITs, and the next SET
// wakes the waits left pending.
BOOST_AUTO_TEST_CASE(compare_set_creating_a_key_wakes_no_waiter, *utf::precondition(torch_available) * utf::timeout(200)) {
  served s;
  program p({"timeout", "150", python(), job_script, "cas_wait", std::to_string(s.port)});
  auto expect = [&](const std::string& want) {
    auto line = p.read_line(60s);
    BOOST_REQUIRE_MESSAGE(line, "torch_job.py cas_wait ended early: " << p.output());
    BOOST_TEST(*line == want);
  };
  expect("waiting");
  BOOST_REQUIRE_MESSAGE(s.pending_waits_reach(1), "no wait registered; output: " << p.drain());
  p.write_line("go");
  expect("compare_set b'v'");
  expect("first waiter timed out");
  expect("later wait returns");
  // The first waiter's WAIT stays at the server (a 1.13 client that times out
  // leaves it there, as with PyTorch's master): the second one makes two.
  expect("waiting");
  BOOST_REQUIRE(s.pending_waits_reach(2));
  p.write_line("go");
  expect("compare_set b'v'");
  expect("waiting");
  BOOST_TEST(s.pending_waits() == 2u); // still waiting after the compare_set's answer
  p.write_line("go");
  expect("second waiter after set woken");
  expect("OK");
  BOOST_TEST(p.wait(60s) == 0);
}

BOOST_AUTO_TEST_CASE(our_client_against_a_pytorch_master, *utf::precondition(torch_available) * utf::timeout(200)) {
  program master({"timeout", "150", python(), job_script, "master", "0"});
  auto line = master.read_line(60s);
  BOOST_REQUIRE_MESSAGE(line, "the PyTorch master printed no port: " << master.output());
  auto port = static_cast<std::uint16_t>(std::stoi(*line));
  event_loop loop;
  loop.start();
  auto s = connect(loop, port, cs::wire_protocol::pytorch_1_13);
  s.set("from_cpp", "hello from corodist");
  BOOST_TEST(s.get("from_py", 30s) == "hello from pytorch");
  BOOST_TEST(s.add("counter", 40) == 40);
  BOOST_TEST(s.add("counter", 2) == 42);
  BOOST_TEST(s.compare_set("from_py", "hello from pytorch", "changed") == "changed");
  BOOST_TEST(s.compare_set("absent", "e", "d") == "e");
  BOOST_TEST(s.check({"from_cpp", "counter"}));
  BOOST_TEST(!s.check({"from_cpp", "nothing"}));
  BOOST_CHECK_THROW(s.wait({"never"}, 200ms), corodist::timeout_error);
  BOOST_TEST(s.get("counter") == "42"); // reconnected after the timed-out wait
  s.multi_set({"multi/a", "multi/b"}, {"A", "B"});
  BOOST_TEST((s.multi_get({"multi/a", "multi/b"}) == std::vector<std::string>{"A", "B"}));
  BOOST_TEST(s.delete_key("absent") == false);
  BOOST_TEST(s.num_keys() >= 5);
  BOOST_CHECK_THROW(s.append("from_cpp", "x"), corodist::store::store_error); // not in 1.13
  s.set("done", "1");
  int rc = master.wait(60s);
  BOOST_TEST_INFO("master output:\n" << master.output());
  BOOST_TEST(rc == 0);
}

BOOST_FIXTURE_TEST_CASE(our_client_in_both_pytorch_modes_shares_keys_with_native, served, *utf::timeout(60)) {
  auto native = connect(loop, port);
  auto v1 = connect(loop, port, cs::wire_protocol::pytorch_1_13);
  auto v2 = connect(loop, port, cs::wire_protocol::pytorch_2);
  BOOST_TEST(native.get("init/", 1s) == "2"); // each counted itself as a PyTorch worker
  exercise(v1, "v1/", false);
  exercise(v2, "v2/", true);
  // Shared keys: PyTorch-mode keys carry the "/" prefix for native clients.
  BOOST_TEST(native.get("/v1/k", 1s) == "y");
  BOOST_TEST(native.get("/v2/a", 1s) == "A+");
  native.set("/from_native", "n");
  BOOST_TEST(v1.get("from_native", 1s) == "n");
  BOOST_TEST(v2.get("from_native", 1s) == "n");
  // A get waiting in 2.x mode is woken by a native set.
  auto waiting = std::async(std::launch::async, [&] { return v2.get("later", 10s); });
  BOOST_REQUIRE(pending_waits_reach(1));
  native.set("/later", "L");
  BOOST_TEST(waiting.get() == "L");
  // Many coroutines on one PyTorch-mode client: queries run one at a time, none lost.
  auto store = v2.async();
  std::promise<void> all_added;
  asio::post(loop.get_executor(), [&, store] {
    auto left = std::make_shared<int>(50);
    for (int i = 0; i < 50; ++i)
      asio::co_spawn(loop.get_executor(), store->add("many", 1), [&, left](std::exception_ptr, std::int64_t) {
        if (--*left == 0)
          all_added.set_value();
      });
  });
  BOOST_REQUIRE((all_added.get_future().wait_for(10s) == std::future_status::ready));
  BOOST_TEST(native.get("/many", 1s) == "50");
}

BOOST_FIXTURE_TEST_CASE(pytorch_2_queues_ping_and_cancel_wait, served, *utf::timeout(60)) {
  asio::io_context ctx;
  v2_socket a(ctx, port), b(ctx, port);
  constexpr char push = 14, pop = 15, len = 16, wait = 6, check = 5, cancel = 12;
  auto one_key = [](const std::string& k) { return std::string("\x01\0\0\0\0\0\0\0", 8) + v2_socket::bytes(k); };
  a.send(len + v2_socket::bytes("q"));
  BOOST_TEST(a.read<std::int64_t>() == 0);
  b.send(wait + one_key("q")); // blocks until the queue has an element
  BOOST_REQUIRE(pending_waits_reach(1));
  a.send(push + v2_socket::bytes("q") + v2_socket::bytes("x1"));
  BOOST_TEST(b.read<std::uint8_t>() == 0); // STOP_WAITING
  a.send(push + v2_socket::bytes("q") + v2_socket::bytes("x2") + len + v2_socket::bytes("q"));
  BOOST_TEST(a.read<std::int64_t>() == 2);
  b.send(pop + v2_socket::bytes("q"));
  BOOST_TEST(b.read<std::int64_t>() == 2); // the length before the pop, then the value
  BOOST_TEST(b.read_bytes() == "x1");
  b.send(pop + v2_socket::bytes("q") + pop + v2_socket::bytes("q"));
  BOOST_TEST(b.read<std::int64_t>() == 1);
  BOOST_TEST(b.read_bytes() == "x2");
  BOOST_TEST(b.read<std::int64_t>() == 0); // empty: no value follows
  b.send(check + one_key("q"));
  BOOST_TEST(b.read<std::uint8_t>() == 1); // NOT_READY: an empty queue is no key
  // CANCEL_WAIT ends a pending wait; a later push does not answer it.
  b.send(wait + one_key("q2"));
  b.send(std::string(1, cancel));
  BOOST_TEST(b.read<std::uint8_t>() == 1); // WAIT_CANCELED
  a.send(push + v2_socket::bytes("q2") + v2_socket::bytes("z") + len + v2_socket::bytes("q2"));
  BOOST_TEST(a.read<std::int64_t>() == 1);
  b.send(len + v2_socket::bytes("q2"));
  BOOST_TEST(b.read<std::int64_t>() == 1); // the next byte b reads is this answer, not a stale STOP_WAITING
}

BOOST_FIXTURE_TEST_CASE(pytorch_mode_caller_cancelled_while_queued, served, *utf::timeout(60)) {
  auto native = connect(loop, port);
  auto v2 = connect(loop, port, cs::wire_protocol::pytorch_2);
  auto store = v2.async();
  // A holds the connection (a get waiting for its key); B queues behind it and
  // is cancelled by its own deadline; once A is done, C must run normally.
  auto a = std::async(std::launch::async, [&] { return v2.get("slow", 10s); });
  BOOST_REQUIRE(pending_waits_reach(1)); // A waits at the server, holding the connection
  auto b = asio::co_spawn(
      loop.get_executor(),
      [store]() -> asio::awaitable<bool> {
        using namespace asio::experimental::awaitable_operators;
        asio::steady_timer t(co_await asio::this_coro::executor, 100ms);
        auto r = co_await (store->add("counter", 1) || t.async_wait(asio::use_awaitable));
        co_return r.index() == 1; // the deadline won
      },
      asio::use_future);
  BOOST_TEST(b.get());
  native.set("/slow", "S");
  BOOST_TEST(a.get() == "S");
  BOOST_TEST(v2.add("counter", 1) == 1); // B never ran, and the lock was not lost
  BOOST_TEST(v2.get("slow", 1s) == "S");
}

// Destroying a PyTorch-mode client's loop while a query is in flight ends that
// query (the event loop closes the client's socket while it drains), for the
// one holding the connection and for one queued behind it.
BOOST_FIXTURE_TEST_CASE(pytorch_mode_client_is_closed_with_its_loop, served, *utf::timeout(60)) {
  std::future<std::string> held, queued;
  {
    event_loop client_loop;
    client_loop.start();
    auto store = connect(client_loop, port, cs::wire_protocol::pytorch_2).async();
    held = asio::co_spawn(client_loop.get_executor(), store->get("never", 30s), asio::use_future);
    BOOST_REQUIRE(pending_waits_reach(1)); // it holds the connection
    std::promise<void> started;
    queued = asio::co_spawn(
        client_loop.get_executor(),
        [&started, store]() -> asio::awaitable<std::string> {
          started.set_value(); // then runs on, in this turn of the loop, into the line for the connection
          co_return co_await store->get("never", 30s);
        },
        asio::use_future);
    started.get_future().wait();
    on_loop(client_loop, [] {}); // a later turn of the loop: it is in the line
  } // the loop stops and drains here
  BOOST_REQUIRE((held.wait_for(5s) == std::future_status::ready));
  BOOST_REQUIRE((queued.wait_for(5s) == std::future_status::ready));
  BOOST_CHECK_THROW(held.get(), corodist::connection_error);
  BOOST_CHECK_THROW(queued.get(), corodist::connection_error);
}

// close() ends the query in flight and the one queued behind it, and every
// later one, with connection_error; the server forgets the client's wait.
BOOST_FIXTURE_TEST_CASE(pytorch_mode_client_close, served, *utf::timeout(60)) {
  auto store = cs::torch_store::connect_sync(loop.get_executor(), [&] {
    cs::tcp_store_options o;
    o.port = port;
    o.timeout = 10s;
    o.protocol = cs::wire_protocol::pytorch_2;
    return o;
  }());
  BOOST_TEST((store->protocol() == cs::wire_protocol::pytorch_2));
  BOOST_TEST(store->remote_endpoint().port() == port);
  auto held = asio::co_spawn(loop.get_executor(), store->get("never", 30s), asio::use_future);
  BOOST_REQUIRE(pending_waits_reach(1));
  auto queued = asio::co_spawn(loop.get_executor(), store->add("n", 1), asio::use_future);
  on_loop(loop, [] {}); // queued behind the get
  store->close();
  BOOST_CHECK_THROW(held.get(), corodist::connection_error);
  BOOST_CHECK_THROW(queued.get(), corodist::connection_error);
  BOOST_CHECK_THROW(cs::sync_store(store).add("n", 1), corodist::connection_error);
  BOOST_TEST(pending_waits_reach(0));
  // A native protocol is tcp_store's business.
  cs::tcp_store_options native;
  native.port = port;
  BOOST_CHECK_THROW(cs::torch_store::connect_sync(loop.get_executor(), native), corodist::usage_error);
}

BOOST_FIXTURE_TEST_CASE(stopped_server_closes_connections_still_sniffing, served, *utf::timeout(60)) {
  asio::io_context ctx;
  auto s = raw_socket(ctx, port); // accepted, first byte not yet seen
  // The listener accepts in arrival order: once a later client is in, s has been accepted.
  auto later = connect(loop, port);
  later.set("/probe", "1");
  BOOST_TEST(later.delete_key("/probe"));
  srv->stop();
  on_loop(loop, [] {}); // stop() ran (it posts to the loop)
  send_all(s, v1_set("/late", "v"));
  BOOST_TEST(closed_by_peer(s));
  BOOST_TEST(connections_reach(0));
  BOOST_TEST(on_loop(loop, [&] { return srv->key_count(); }) == 0u);
}

BOOST_FIXTURE_TEST_CASE(bad_first_bytes_close_only_that_connection, served, *utf::timeout(60)) {
  auto native = connect(loop, port);
  auto v2 = connect(loop, port, cs::wire_protocol::pytorch_2);
  native.set("keep", "safe");
  asio::io_context ctx;
  auto refused = [&](const std::string& bytes) {
    auto s = raw_socket(ctx, port);
    send_all(s, bytes);
    return closed_by_peer(s);
  };
  BOOST_TEST(refused("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); // neither protocol
  BOOST_TEST(refused(std::string(1, '\x14') + "junk"));     // a PyTorch-range code no version has
  BOOST_TEST(refused(std::string(1, '\x07') + std::string(8, '\x01'))); // 1.13 WATCH_KEY: unsupported
  {
    std::string q(1, '\0'); // 1.13 SET whose key claims 1 TiB
    std::uint64_t huge = std::uint64_t{1} << 40;
    q.append(reinterpret_cast<const char*>(&huge), 8);
    BOOST_TEST(refused(q));
  }
  {
    std::string q(1, '\0'); // 2.x VALIDATE, then a code past the 2.x table
    std::uint32_t magic = 0x3C85F7CE;
    q.append(reinterpret_cast<const char*>(&magic), 4);
    q += '\x1f';
    BOOST_TEST(refused(q));
  }
  // A 1.13 SET split across writes is served once whole.
  {
    BOOST_REQUIRE(connections_reach(2)); // the refused ones are gone
    auto s = raw_socket(ctx, port);
    auto q = v1_set("/split", "value");
    send_all(s, std::string_view(q).substr(0, 3));
    BOOST_REQUIRE(connections_reach(3)); // its session...
    on_loop(loop, [] {});                                          // ...has read the first 3 bytes alone
    send_all(s, std::string_view(q).substr(3));
    BOOST_TEST(native.get("/split", 5s) == "value");
  }
  // The other clients and the data are unharmed.
  BOOST_TEST(native.get("keep", 1s) == "safe");
  BOOST_TEST(v2.add("x", 1) == 1);
}

BOOST_AUTO_TEST_CASE(pytorch_protocol_can_be_switched_off, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  asio::io_context ctx;
  {
    auto srv = start_server(loop, false);
    auto port = srv->local_endpoint().port();
    auto s = raw_socket(ctx, port);
    send_all(s, v1_set("/k", "v"));
    BOOST_TEST(closed_by_peer(s));
    auto silent = raw_socket(ctx, port); // closed at the 500 ms handshake timeout
    BOOST_TEST(closed_by_peer(silent));
    BOOST_TEST(on_loop(loop, [&] { return srv->key_count(); }) == 0u);
  }
  {
    // Switched on, a silent connection (PyTorch 1.13's second one) stays open:
    // past the 500 ms handshake timeout it becomes a (silent) PyTorch session.
    auto srv = start_server(loop, true);
    auto silent = raw_socket(ctx, srv->local_endpoint().port());
    BOOST_TEST(corodist::test::server_reaches(loop, *srv, [&] { return srv->connection_count() == 1u; }));
    pollfd p{silent.native_handle(), POLLIN, 0};
    BOOST_TEST(::poll(&p, 1, 0) == 0); // nothing to read: not closed
    BOOST_TEST(on_loop(loop, [&] { return srv->connection_count(); }) == 1u);
  }
}

// A native client whose hello comes after the handshake timeout (one of a
// thousand connecting at once, say) was taken for a silent PyTorch client and
// closed when its 'C' arrived (an unknown query code 67). Its hello is answered.
BOOST_AUTO_TEST_CASE(a_late_native_hello_is_answered, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  asio::io_context ctx;
  auto srv = start_server(loop, true);
  auto late = raw_socket(ctx, srv->local_endpoint().port());
  BOOST_REQUIRE(corodist::test::server_reaches(loop, *srv, [&] { return srv->connection_count() == 1u; })); // silent now
  const auto hello = corodist::net::encode(corodist::net::hello{});
  send_all(late, std::string_view(reinterpret_cast<const char*>(hello.data()), hello.size()));
  std::array<std::byte, corodist::net::hello_size> answer{};
  std::error_code ec;
  asio::read(late, asio::buffer(answer), ec);
  BOOST_TEST_REQUIRE(!ec, "the server closed instead of answering: " << ec.message());
  BOOST_TEST(corodist::net::decode_hello(answer.data()).magic == corodist::net::protocol_magic);
}

BOOST_AUTO_TEST_SUITE_END()
