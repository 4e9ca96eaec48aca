#define BOOST_TEST_MODULE corodist_rpc
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/shared_future.hpp>
#include <corodist/rpc/agent.hpp>

#include "rpc/protocol.hpp"
#include "rpc/rpc_fixtures.hpp"
#include "support/cancel.hpp"
#include "support/forwarding_store.hpp"
#include "support/coro_test.hpp"
#include "support/loop_helpers.hpp"
#include "support/temp_file.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <asio/post.hpp>

#include <future>
#include <latch>
#include <latch>
#include <numeric>
#include <poll.h>
#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
using corodist::event_loop;
using corodist::test::cluster;
using corodist::test::point;
using corodist::test::run_coro;

namespace {


std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + (i >> 12)) & 0xff);
  return v;
}

// A worker's store whose worker-table read (the end of the agent's join)
// waits until the test opens it, forwarding everything else: a worker that the
// others already see as joined, whose own start() has not ended.
class join_gate : public corodist::test::forwarding_store {
public:
  using forwarding_store::forwarding_store;
  /// Set once the worker waits at the gate.
  std::promise<void> reached;
  /// Opens the gate (any thread).
  void open() { open_.set_value(); }

private:
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> ks,
                                                         corodist::deadline by) override {
    reached.set_value();
    co_await opened_.async_wait(asio::use_awaitable);
    co_return co_await inner_->multi_get(std::move(ks), by.left());
  }

  corodist::promise<void> open_;
  corodist::future<void> opened_ = open_.get_future();
};

} // namespace

BOOST_AUTO_TEST_SUITE(rpc_agent)

// w0 calls w1 as soon as its own start() ends, while w1's start() still reads
// the worker table: the call waits for w1's start to end, and the function,
// which calls w0 back, then runs as on a started worker (served at once, its
// own call failed "agent 'w1' is not started").
BOOST_AUTO_TEST_CASE(a_call_that_comes_while_the_callee_starts_waits_for_its_start, *utf::timeout(60)) {
  std::shared_ptr<join_gate> gate;
  cluster c(2, [&](rpc::agent_options& o) {
    if (o.rank == 1)
      o.store = gate = std::make_shared<join_gate>(o.store);
  }, false);
  std::thread late([&] { c[1].start(); });
  gate->reached.get_future().wait(); // w1 is published, its start() not ended
  c[0].start();
  auto f = c[0].rpc_async<int>("w1", "co_relay", std::string("w0"), 41);
  // The call goes out once w0's channel to w1 is up (its hello answered by
  // w1's loop, which runs): the gate opens after that, the call on its way.
  while (!corodist::test::on_loop(*c.loops[0], [&] { return c[0].connected_peers() == 1; })) {
  }
  corodist::test::on_loop(*c.loops[0], [] {}); // after the write the flush queued
  gate->open();
  late.join();
  BOOST_TEST(f.get() == 42);
}

// rpc_sync, rpc_async and call (from a coroutine) reach the function; workers
// are found by name and by rank.
BOOST_AUTO_TEST_CASE(sync_async_and_coroutine_calls, *utf::timeout(60)) {
  cluster c(2);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
  BOOST_TEST(c[0].rpc_sync<std::string>(1, "whoami") == "w1");
  BOOST_TEST(c[1].rpc_sync<std::string>("w0", "whoami") == "w0");
  auto f = c[0].rpc_async<int>("w1", "co_add", 20, 22);
  BOOST_TEST(f.get() == 42);
  c[0].rpc_sync<void>("w1", "nothing");
  BOOST_TEST(c[0].rpc_sync<std::string>("w1", "concat", "ab", std::string("cd")) == "abcd");

  asio::io_context ctx;
  auto r = run_coro(ctx, [&]() -> asio::awaitable<int> {
    int a = co_await c[0].call<int>("w1", "add", 1, 2);
    int b = co_await c[1].call<int>(0, "co_add", a, 10);
    co_return b;
  }());
  BOOST_TEST(r == 13);

  const auto& infos = c[0].get_worker_infos();
  BOOST_TEST(infos.size() == 2u);
  BOOST_TEST(infos[1].name == "w1");
  BOOST_TEST(c[0].get_worker_info("w1").rank == 1);
  BOOST_TEST(c[0].get_worker_info(1).port == c[1].local_endpoint().port());
  BOOST_TEST(c[1].self().name == "w1");
  BOOST_CHECK_THROW(c[0].get_worker_info("nobody"), corodist::usage_error);
  // rpc_sync on a loop thread would deadlock: it throws instead.
  std::promise<bool> threw;
  asio::post(c.loops[0]->get_executor(), [&] {
    try {
      c[0].rpc_sync<int>("w1", "add", 1, 1);
      threw.set_value(false);
    } catch (const corodist::usage_error&) {
      threw.set_value(true);
    }
  });
  BOOST_TEST(threw.get_future().get());
  c.shutdown_all();
}

// User structs (msgpack adaptors) with an attachment inside, and nested calls
// from a coroutine function and from a blocking one.
BOOST_AUTO_TEST_CASE(structs_attachments_and_nested_calls, *utf::timeout(60)) {
  cluster c(3);
  point p;
  p.x = 1;
  p.y = 2.5;
  p.label = "p";
  p.tags = {1, 2, 3};
  p.blob = rpc::attachment::copy_of("blob bytes");
  auto q = c[0].rpc_sync<point>("w2", "move_point", p, 10);
  BOOST_TEST(q.x == 11);
  BOOST_TEST(q.y == 2.5);
  BOOST_TEST(q.label == "p!");
  BOOST_TEST((q.tags == std::vector<int>{1, 2, 3}));
  BOOST_TEST(q.blob.str() == "blob bytes");
  BOOST_TEST(c[0].rpc_sync<int>("w1", "co_relay", "w2", 41) == 42);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "relay", "w2", 41) == 42);
  BOOST_TEST(c[2].rpc_sync<int>("w1", "relay", "w0", 1) == 2);
  c.shutdown_all();
}

// A 64 MiB attachment goes out and comes back intact; the echo sends the
// received bytes back without copying them.
BOOST_AUTO_TEST_CASE(payload_64MiB, *utf::timeout(120)) {
  cluster c(2);
  const std::size_t n = std::size_t{64} << 20;
  auto data = std::make_shared<std::vector<std::byte>>(pattern(n));
  rpc::attachment a(data, std::span<const std::byte>(*data));
  auto back = c[0].rpc_sync<rpc::attachment>("w1", "echo_att", a);
  BOOST_TEST(back.size() == n);
  BOOST_TEST(std::memcmp(back.data(), data->data(), n) == 0);
  BOOST_TEST(c[1].rpc_sync<std::size_t>("w0", "att_size", a) == n);
  // The same size as a msgpack string (copied into the body).
  std::string big(n, 'x');
  auto s = c[0].rpc_sync<std::string>("w1", "concat", big, "!");
  BOOST_TEST(s.size() == n + 1);
  c.shutdown_all();
}

// 10,000 rpc_async calls in flight at once, in both directions, coroutine and
// blocking functions mixed.
BOOST_AUTO_TEST_CASE(ten_thousand_async_calls_in_flight, *utf::timeout(120)) {
  cluster c(2);
  constexpr int n = 10000;
  std::vector<corodist::future<int>> a, b;
  a.reserve(n);
  b.reserve(n);
  for (int i = 0; i < n; ++i) {
    a.push_back(c[0].rpc_async<int>("w1", i % 2 ? "add" : "co_add", i, 1));
    b.push_back(c[1].rpc_async<int>("w0", "co_add", i, 2));
  }
  long bad = 0;
  for (int i = 0; i < n; ++i) {
    bad += a[i].get() != i + 1;
    bad += b[i].get() != i + 2;
  }
  BOOST_TEST(bad == 0);
  c.shutdown_all();
}

// Blocking functions run on the pool (in parallel, up to worker_threads) while
// coroutine functions keep answering on the loop.
BOOST_AUTO_TEST_CASE(coroutine_and_blocking_functions_side_by_side, *utf::timeout(60)) {
  cluster c(2);
  auto& log = corodist::test::sleeps();
  const int entered = log.entries(), left = log.exits();
  corodist::test::holds().close();
  std::vector<corodist::future<int>> slow;
  for (int i = 0; i < 4; ++i)
    slow.push_back(c[0].rpc_async<int>("w1", "hold", i));
  // All four run at once, one per pool thread, held there ...
  BOOST_TEST_REQUIRE(log.wait_entries(entered + 4));
  // ... and while they are, the loop answers coroutine functions.
  for (int i = 0; i < 20; ++i)
    BOOST_TEST(c[0].rpc_sync<int>("w1", "co_add", i, i) == 2 * i);
  BOOST_TEST(log.exits() == left, "the coroutine calls were answered while every pool thread was busy");
  corodist::test::holds().open();
  for (int i = 0; i < 4; ++i)
    BOOST_TEST(slow[static_cast<std::size_t>(i)].get() == i);
  c.shutdown_all();
}

// The agent on a user's io_context (embedded mode): the user runs the context.
BOOST_AUTO_TEST_CASE(embedded_mode_on_user_io_context, *utf::timeout(60)) {
  asio::io_context ctx;
  event_loop loop(ctx);
  event_loop store_loop;
  store_loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(store_loop.get_executor());
  event_loop other;
  other.start();
  rpc::agent a(loop, corodist::test::worker_options(0, 2, store));
  rpc::agent b(other, corodist::test::worker_options(1, 2, store));
  corodist::test::register_standard(a, "w0");
  corodist::test::register_standard(b, "w1");
  std::thread bt([&] { b.start(); });
  int r = 0;
  std::string failure;
  try {
    r = run_coro(ctx, [&]() -> asio::awaitable<int> {
      co_await a.async_start();
      int x = co_await a.call<int>("w1", "add", 40, 2);
      int y = co_await a.call<int>("w1", "co_relay", "w0", x);
      co_return y;
    }());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  bt.join();
  BOOST_TEST(failure == "");
  BOOST_TEST(r == 43);
  // Both shut down together: each waits for the other in the barrier.
  std::thread bs([&] { b.shutdown(); });
  try {
    run_coro(ctx, a.async_shutdown());
  } catch (const std::exception& e) {
    failure = e.what();
  }
  bs.join();
  BOOST_TEST(failure == "");
}

// Two workers that call each other for the first time at the same moment
// both succeed (each direction dials its own connection), many times over.
BOOST_AUTO_TEST_CASE(simultaneous_first_calls, *utf::timeout(120)) {
  for (int round = 0; round < 20; ++round) {
    cluster c(2);
    std::latch go(2);
    std::atomic<int> ok{0};
    c.for_each_agent([&](rpc::agent& a, int r) {
      go.arrive_and_wait();
      ok += a.rpc_sync<int>(1 - r, "add", r, 100) == r + 100;
    });
    BOOST_TEST(ok.load() == 2);
    std::size_t open = corodist::test::on_loop(*c.loops[0], [&] { return c[0].connected_peers(); });
    BOOST_TEST(open == 1u);
    c.shutdown_all();
  }
}

// An agent given a rendezvous URL instead of a store (here file://) gets
// its store, rank and world size from the rendezvous.
BOOST_AUTO_TEST_CASE(init_method_rendezvous, *utf::timeout(30)) {
  const corodist::test::temp_file file;
  const std::string& path = file.path;
  {
    std::vector<std::unique_ptr<event_loop>> loops;
    std::vector<std::unique_ptr<rpc::agent>> agents;
    for (int r = 0; r < 2; ++r) {
      loops.push_back(std::make_unique<event_loop>());
      loops.back()->start();
      rpc::agent_options o;
      o.name = "w" + std::to_string(r);
      o.init_method = "file://" + path + "?rank=" + std::to_string(r) + "&world_size=2";
      o.init_timeout = 20s;
      o.shutdown_timeout = 20s;
      o.auth_token = "";
      agents.push_back(std::make_unique<rpc::agent>(*loops.back(), o));
      corodist::test::register_standard(*agents.back(), o.name);
    }
    std::thread t([&] { agents[1]->start(); });
    agents[0]->start();
    t.join();
    BOOST_TEST(agents[0]->rpc_sync<std::string>(1, "whoami") == "w1");
    BOOST_TEST(agents[1]->self().rank == 1);
    BOOST_TEST(agents[1]->get_worker_infos().size() == 2u);
    std::thread s([&] { agents[1]->shutdown(); });
    agents[0]->shutdown();
    s.join();
    agents.clear();
  }
}

// With sync_spin, rpc_sync polls for the reply before sleeping: short calls
// and calls that outlast the spin both complete.
BOOST_AUTO_TEST_CASE(rpc_sync_with_spin, *utf::timeout(30)) {
  cluster c(2, [](rpc::agent_options& o) { o.sync_spin = 200us; });
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(c[0].rpc_sync<int>("w1", "co_add", i, 1) == i + 1);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "sleep_ms", 20) == 20);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(10ms, "w1", "co_sleep_ms", 200), corodist::timeout_error);
  c.shutdown_all();
}

// A call that arrives while its callee still waits for the worker table waits
// for the callee's start() to end, and then names its caller. Each agent meets
// the other through its own store, and the test copies the records across: the
// caller's record reaches the callee's store only after the call was sent.
BOOST_AUTO_TEST_CASE(a_call_before_the_callee_has_the_worker_table_waits_and_names_its_caller, *utf::timeout(60)) {
  event_loop store_loop;
  store_loop.start();
  auto caller_store = std::make_shared<corodist::store::hash_store>(store_loop.get_executor());
  auto callee_store = std::make_shared<corodist::store::hash_store>(store_loop.get_executor());
  caller_store->set_timeout(20s);
  callee_store->set_timeout(20s);
  auto copy_record = [&](corodist::store::hash_store& from, corodist::store::hash_store& to, int rank) {
    const std::string key = std::string(rpc::agent_options::default_key_prefix) + "workers/" + std::to_string(rank);
    auto record = asio::co_spawn(store_loop.get_executor(), from.get(key), asio::use_future).get();
    asio::co_spawn(store_loop.get_executor(), to.set(key, record), asio::use_future).get();
  };
  event_loop l0, l1;
  l0.start();
  l1.start();
  {
    rpc::agent caller(l0, corodist::test::worker_options(0, 2, caller_store));
    rpc::agent callee(l1, corodist::test::worker_options(1, 2, callee_store));
    callee.register_function("who", [](const rpc::call_context& ctx) {
      return ctx.caller() + "/" + std::to_string(ctx.caller_rank());
    });
    caller.register_function("who", [](const rpc::call_context& ctx) {
      return ctx.caller() + "/" + std::to_string(ctx.caller_rank());
    });
    auto callee_started = std::async(std::launch::async, [&] { callee.start(); });
    copy_record(*callee_store, *caller_store, 1); // the callee listens and waits for rank 0's record
    caller.start();
    auto first = caller.rpc_async<std::string>("w1", "who");
    // The call is written once the channel is up, by a write the flush queued.
    while (!corodist::test::on_loop(l0, [&] { return caller.connected_peers() == 1; })) {
    }
    corodist::test::on_loop(l0, [] {});
    BOOST_TEST((callee_started.wait_for(0s) == std::future_status::timeout)); // still without the table
    copy_record(*caller_store, *callee_store, 0);
    callee_started.get();
    BOOST_TEST(first.get() == "w0/0");
    BOOST_TEST(caller.rpc_sync<std::string>("w1", "who") == "w0/0");
    BOOST_TEST(callee.rpc_sync<std::string>("w0", "who") == "w1/1");
  } // (destroyed without a graceful shutdown: the two stores share no barrier)
}

// A void function's reply is made without an encoder: the same bytes as
// encode_nil's, recognized as such, decoding to nil.
BOOST_AUTO_TEST_CASE(a_void_result_is_the_payload_encode_nil_makes) {
  rpc::encoder e;
  const auto made = rpc::encode_nil(e);
  auto nil = rpc::nil_payload();
  BOOST_TEST((nil.body == made.body));
  BOOST_TEST(nil.attachments.empty());
  BOOST_TEST(rpc::is_nil_payload(nil.body));
  rpc::codec_context ctx;
  const auto parsed = rpc::parse_payload(std::move(nil.body), ctx);
  BOOST_TEST(parsed.body.get().type == msgpack::type::NIL);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rpc_errors)

BOOST_AUTO_TEST_CASE(unknown_function, *utf::timeout(30)) {
  cluster c(2);
  try {
    c[0].rpc_sync<int>("w1", "no_such_function", 1);
    BOOST_FAIL("expected unknown_function_error");
  } catch (const rpc::unknown_function_error& e) {
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.type() == "unknown_function");
    BOOST_TEST(e.message().find("no_such_function") != std::string::npos);
  }
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "no_such_function"), corodist::remote_error);
  c.shutdown_all();
}

BOOST_AUTO_TEST_CASE(bad_arguments, *utf::timeout(30)) {
  cluster c(2);
  try {
    c[0].rpc_sync<int>("w1", "add", "two", 3);
    BOOST_FAIL("expected bad_arguments_error");
  } catch (const rpc::bad_arguments_error& e) {
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.type() == "bad_arguments");
    BOOST_TEST_MESSAGE(e.what());
    BOOST_TEST(e.message().find("argument 0 (msgpack str) does not decode to int") != std::string::npos);
  }
  try {
    c[0].rpc_sync<int>("w1", "add", 1);
    BOOST_FAIL("expected bad_arguments_error");
  } catch (const rpc::bad_arguments_error& e) {
    BOOST_TEST(e.message().find("expected 2 argument(s), got 1") != std::string::npos);
  }
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "co_add", 1, 2, 3), rpc::bad_arguments_error);
  // A result that does not decode to the caller's type: named, with what came.
  try {
    c[0].rpc_sync<std::string>("w1", "add", 1, 2);
    BOOST_FAIL("expected bad_result_error");
  } catch (const rpc::bad_result_error& e) {
    BOOST_TEST(std::string(e.what()).find("rpc 'add' on worker 'w1'") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("positive integer") != std::string::npos, e.what());
  }
  // The connection is still fine.
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 2) == 3);
  c.shutdown_all();
}

BOOST_AUTO_TEST_CASE(remote_exception, *utf::timeout(30)) {
  cluster c(2);
  try {
    c[0].rpc_sync<int>("w1", "fail", "boom");
    BOOST_FAIL("expected remote_error");
  } catch (const corodist::remote_error& e) {
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.type() == "std::runtime_error");
    BOOST_TEST(e.message() == "boom");
  }
  try {
    c[1].rpc_sync<void>("w0", "fail_custom", "custom");
    BOOST_FAIL("expected remote_error");
  } catch (const corodist::remote_error& e) {
    BOOST_TEST(e.worker() == "w0");
    BOOST_TEST(e.type() == "corodist::test::custom_failure");
    BOOST_TEST(e.message() == "custom");
  }
  try {
    c[0].rpc_sync<void>("w1", "co_fail", "from a coroutine");
    BOOST_FAIL("expected remote_error");
  } catch (const corodist::remote_error& e) {
    BOOST_TEST(e.type() == "std::invalid_argument");
    BOOST_TEST(e.message() == "from a coroutine");
  }
  c.shutdown_all();
}

// A call past its deadline fails with timeout_error; the late reply is
// dropped and the channel keeps working.
BOOST_AUTO_TEST_CASE(timeout_and_late_reply, *utf::timeout(30)) {
  cluster c(2, [](rpc::agent_options& o) { o.rpc_timeout = 5s; });
  auto& log = corodist::test::sleeps();
  const int left = log.exits();
  corodist::test::holds().close(); // the call runs until after its deadline
  try {
    c[0].rpc_sync<int>(100ms, "w1", "hold", 400);
    BOOST_FAIL("no timeout");
  } catch (const corodist::timeout_error& e) {
    BOOST_TEST(std::string(e.what()).find("deadline 100 ms") != std::string::npos, e.what());
  }
  corodist::test::holds().open();
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(50ms, "w1", "co_sleep_ms", 300), corodist::timeout_error);
  // Both functions end later and reply (the coroutine one is cancelled at its
  // deadline): those late replies come in first on the channel, ahead of the
  // next call's, and must not be taken for its answer.
  BOOST_TEST_REQUIRE(log.wait_exits(left + 2));
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 2) == 3);
  // The default deadline (rpc_timeout) applies too.
  cluster d(2, [](rpc::agent_options& o) { o.rpc_timeout = 100ms; });
  BOOST_CHECK_THROW(d[0].rpc_sync<int>("w1", "co_sleep_ms", 400), corodist::timeout_error);
  BOOST_TEST(d[0].rpc_sync<int>(corodist::timeout::never(), "w1", "co_sleep_ms", 200) == 200);
  c.shutdown_all();
  d.shutdown_all();
}

BOOST_AUTO_TEST_CASE(timeout_covers_the_first_dial, *utf::timeout(30)) {
  cluster c(2, [](rpc::agent_options& o) { o.rpc_timeout = 5s; });
  // w1's loop is stalled: the TCP connect to it succeeds (the kernel accepts),
  // but its hello never comes. The call's 200 ms must bound the dial too.
  std::promise<void> release;
  auto stalled = release.get_future().share();
  asio::post(c.loops[1]->get_executor(), [stalled] { stalled.wait_for(3s); });
  try {
    c[0].rpc_sync<int>(200ms, "w1", "add", 1, 2);
    BOOST_FAIL("no timeout");
  } catch (const corodist::timeout_error& e) {
    // The call's own deadline, not the dial's 10 s handshake timeout.
    BOOST_TEST(std::string(e.what()).find("deadline 200 ms") != std::string::npos, e.what());
  }
  release.set_value();
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 2) == 3); // a later call dials again and succeeds
  c.shutdown_all();
}

BOOST_AUTO_TEST_CASE(usage_errors, *utf::timeout(30)) {
  cluster c(2, {}, false);
  // Before start.
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "add", 1, 2), corodist::usage_error);
  BOOST_CHECK_THROW(c[0].register_function("add", [] {}), corodist::usage_error); // duplicate
  c.start_all();
  BOOST_CHECK_THROW(c[0].register_function("late", [] {}), corodist::usage_error);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w7", "add", 1, 2), corodist::usage_error);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(7, "add", 1, 2), corodist::usage_error);
  BOOST_CHECK_THROW(c[0].start(), corodist::usage_error);
  c.shutdown_all();
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "add", 1, 2), corodist::usage_error);
  c[0].shutdown(); // idempotent
  // Options the agent cannot work with.
  rpc::agent_options o;
  BOOST_CHECK_THROW(rpc::agent(*c.loops[0], o), corodist::usage_error);
  o.name = "x";
  BOOST_CHECK_THROW(rpc::agent(*c.loops[0], o), corodist::usage_error);
}

// A request of an upper layer's kind (message_port) names the operation the
// caller gave in its errors, never the kind's number (it used to say "request
// of kind 1792" and "has no handler for message kind 1792"); so do set_handler's
// refusals (they said "message kind 0x0700").
BOOST_AUTO_TEST_CASE(port_requests_name_their_operation, *utf::timeout(30)) {
  cluster c(2, {}, false);
  constexpr rpc::message_kind kind_ping = 0x0700;
  auto answer = [](rpc::inbound_message&&, rpc::responder&& r) { r.reply({}); };
  c[0].port().set_handler(kind_ping, "test: ping", answer); // w1 does not handle pings
  auto what_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const corodist::error& e) {
      return e.what();
    }
    return {};
  };
  BOOST_TEST(what_of([&] { c[0].port().set_handler(kind_ping, "test: pong", answer); }) ==
             "rpc: set_handler('test: pong'): its message kind is already handled by 'test: ping'");
  BOOST_TEST(what_of([&] { c[0].port().set_handler(rpc::rpc_kinds_begin + 1, "test: mine", answer); }) ==
             "rpc: set_handler('test: mine'): its message kind is reserved for rpc's own messages "
             "(rpc_kinds_begin to rpc_kinds_end)");
  c.start_all();
  BOOST_TEST(what_of([&] { c[1].port().request(0, kind_ping, {}, corodist::deadline::after(5s), "ping of 'w0'").get(); }) == "");
  BOOST_TEST(what_of([&] { c[0].port().request(1, kind_ping, {}, corodist::deadline::after(5s), "ping of 'w1'").get(); }) ==
             "ping of 'w1': worker 'w1' rejected it: worker 'w1' does not handle this request (the layer that sent "
             "it is not enabled there)");
  c.shutdown_all();
  BOOST_TEST(what_of([&] { c[1].port().request(0, kind_ping, {}, corodist::deadline::after(5s), "ping of 'w0'").get(); }) ==
             "ping of 'w0': agent 'w1' is shut down");
}

// A second worker claiming a taken name fails start() naming both ranks.
BOOST_AUTO_TEST_CASE(duplicate_name, *utf::timeout(30)) {
  cluster c(2, [](rpc::agent_options& o) {
    o.name = "same";
    o.init_timeout = 2s;
  }, false);
  std::vector<std::string> errors(2);
  c.for_each_agent([&](rpc::agent& a, int r) {
    try {
      a.start();
    } catch (const corodist::error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  // One of them lost the name at once; the other waited for it in vain.
  int duplicate = 0;
  for (auto& e : errors) {
    BOOST_TEST_MESSAGE(e);
    if (e.find("worker name 'same' is already taken by rank") != std::string::npos)
      ++duplicate;
  }
  BOOST_TEST(duplicate == 1);
}

// A message over max_message_size fails the call, not the channel.
BOOST_AUTO_TEST_CASE(message_too_large, *utf::timeout(30)) {
  cluster c(2, [](rpc::agent_options& o) { o.max_message_size = 1 << 20; });
  auto big = rpc::attachment(std::vector<std::byte>(2 << 20));
  BOOST_CHECK_THROW(c[0].rpc_sync<std::size_t>("w1", "att_size", big), corodist::usage_error);
  // A result over the callee's limit: the callee reports it.
  auto small = rpc::attachment(std::vector<std::byte>(600 << 10));
  BOOST_CHECK_THROW(c[0].rpc_sync<std::string>("w1", "make_string", std::size_t{2} << 20), corodist::remote_error);
  BOOST_TEST(c[0].rpc_sync<std::size_t>("w1", "att_size", small) == std::size_t{600 << 10});
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 2) == 3);
  c.shutdown_all();
}

// A peer that goes away (here: its agent destroyed) fails every call pending
// to it at once with connection_error; later calls fail to connect.
BOOST_AUTO_TEST_CASE(peer_death_fails_pending_calls, *utf::timeout(30)) {
  cluster c(2);
  std::vector<corodist::future<int>> pending;
  const int entered = corodist::test::sleeps().entries(); // before the calls: they may enter at once
  for (int i = 0; i < 3; ++i)
    pending.push_back(c[0].rpc_async<int>("w1", "co_sleep_ms", 10000));
  pending.push_back(c[0].rpc_async<int>("w1", "sleep_ms", 500));
  BOOST_TEST_REQUIRE(corodist::test::sleeps().wait_entries(entered + 4)); // all four are running on w1
  c.agents[1].reset(); // immediate: closes its connections
  for (auto& f : pending)
    BOOST_CHECK_THROW(f.get(), corodist::connection_error);
  BOOST_CHECK_THROW(c[0].rpc_sync<int>("w1", "add", 1, 2), corodist::connection_error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rpc_shutdown)

// Graceful shutdown waits for the calls in flight everywhere, including nested
// calls that start after the callee has itself entered shutdown.
BOOST_AUTO_TEST_CASE(graceful_with_calls_in_flight, *utf::timeout(60)) {
  cluster c(3);
  std::vector<corodist::future<int>> fs;
  fs.push_back(c[0].rpc_async<int>("w1", "sleep_ms", 300));
  fs.push_back(c[0].rpc_async<int>("w2", "co_sleep_ms", 300));
  fs.push_back(c[1].rpc_async<int>("w0", "sleep_ms", 200));
  // w2 serves a blocking relay that calls w0 after everybody began shutting down.
  fs.push_back(c[2].rpc_async<int>("w1", "relay", "w0", 7));
  c.shutdown_all();
  BOOST_TEST(fs[0].get() == 300);
  BOOST_TEST(fs[1].get() == 300);
  BOOST_TEST(fs[2].get() == 200);
  BOOST_TEST(fs[3].get() == 8);
  for (int r = 0; r < 3; ++r)
    BOOST_CHECK_THROW(c[r].rpc_sync<int>("w0", "add", 1, 2), corodist::usage_error);
}

// Nested calls issued by a function after shutdown started: the join
// protocol runs rounds until no worker saw new calls.
BOOST_AUTO_TEST_CASE(graceful_with_late_nested_calls, *utf::timeout(60)) {
  cluster c(3);
  std::latch shutting_down(2); // w0 and w1 are calling shutdown() (their join waits for w2)
  auto& log = corodist::test::sleeps();
  const int entered = log.entries();
  std::atomic<int> done{0};
  auto f = c[0].rpc_async<int>("w1", "co_relay", "w2", 1);
  std::thread late([&] {
    // Starts once w0 and w1 are shutting down (w2 is not yet).
    shutting_down.wait();
    done += c[2].rpc_sync<int>("w0", "sleep_ms", 200) == 200;
  });
  c.for_each_agent([&](rpc::agent& a, int r) {
    if (r == 2)
      BOOST_TEST_REQUIRE(log.wait_entries(entered + 1)); // the late call is running on w0
    else
      shutting_down.count_down();
    a.shutdown();
  });
  late.join();
  BOOST_TEST(f.get() == 2);
  BOOST_TEST(done.load() == 1);
}

// A call that outlasts shutdown_timeout makes graceful shutdown give up with a
// timeout_error that says what is still in flight; the caller's call then fails.
// A call that ends before the timeout lets shutdown finish right after it.
BOOST_AUTO_TEST_CASE(graceful_shutdown_gives_up_after_its_timeout, *utf::timeout(30)) {
  {
    // An hour's timeout: the test's own 30 s limit would catch a shutdown that waited for it.
    cluster c(2, [](rpc::agent_options& o) { o.shutdown_timeout = 1h; });
    auto short_call = c[0].rpc_async<int>("w1", "co_sleep_ms", 100);
    c.shutdown_all();
    BOOST_TEST(short_call.get() == 100);
  }
  cluster c(2, [](rpc::agent_options& o) { o.shutdown_timeout = 300ms; });
  const int entered = corodist::test::sleeps().entries();
  auto f = c[0].rpc_async<int>("w1", "co_sleep_ms", 5000);
  BOOST_TEST_REQUIRE(corodist::test::sleeps().wait_entries(entered + 1)); // in flight on both sides
  std::atomic<int> timeouts{0}, named{0};
  c.for_each_agent([&](rpc::agent& a, int) {
    try {
      a.shutdown();
    } catch (const corodist::timeout_error& e) {
      ++timeouts;
      const bool says = std::string(e.what()).find("still in flight") != std::string::npos;
      named += says;
      if (!says)
        BOOST_TEST_MESSAGE("a shutdown timeout that does not say what is in flight: " << e.what());
    }
  });
  // Both give up. The one whose call was still running says so; the other may
  // have seen its end when the first closed, and then times out in the join's
  // store barrier instead (which names the key it waited for).
  BOOST_TEST(timeouts.load() == 2);
  BOOST_TEST(named.load() >= 1);
  BOOST_CHECK_THROW(f.get(), corodist::connection_error);
}

// Graceful shutdown has one deadline, and a step gets half of what is left of
// it: a step that takes all it is given (and a little more, as a real one may)
// on one worker does not make the others give up waiting for it in the barrier
// behind the step (each wait used to get the whole shutdown_timeout, so the
// others' barrier timed out first).
BOOST_AUTO_TEST_CASE(a_slow_shutdown_step_does_not_fail_the_others, *utf::timeout(30)) {
  cluster c(3, [](rpc::agent_options& o) { o.shutdown_timeout = 2s; }, false);
  std::atomic<int> ran{0};
  for (int r = 0; r < 3; ++r)
    c[r].port().add_shutdown_step("test: slow on w0", [r, &ran](corodist::deadline by) -> asio::awaitable<void> {
      ++ran;
      if (r == 0) { // all of its time, and more
        asio::steady_timer t(co_await asio::this_coro::executor, by.at() + 200ms);
        co_await t.async_wait(asio::use_awaitable);
      }
    });
  c.start_all();
  BOOST_CHECK_NO_THROW(c.shutdown_all());
  BOOST_TEST(ran.load() == 3);
}

// A step that throws on one worker: that worker still passes the barrier
// behind it and runs the later steps, so the others finish at once and
// without error; its own shutdown() closes the agent, then throws the step's
// exception.
BOOST_AUTO_TEST_CASE(a_failed_shutdown_step_fails_only_its_worker, *utf::timeout(60)) {
  cluster c(3, [](rpc::agent_options& o) { o.shutdown_timeout = 30s; }, false);
  std::atomic<int> second{0};
  for (int r = 0; r < 3; ++r) {
    c[r].port().add_shutdown_step("test: fails on w1", [r](corodist::deadline) -> asio::awaitable<void> {
      if (r == 1)
        throw std::runtime_error("the step of w1 failed");
      co_return;
    });
    c[r].port().add_shutdown_step("test: counts", [&second](corodist::deadline) -> asio::awaitable<void> {
      ++second;
      co_return;
    });
  }
  c.start_all();
  std::array<std::string, 3> errors;
  auto done = std::async(std::launch::async, [&] {
    c.for_each_agent([&](rpc::agent& a, int r) {
      try {
        a.shutdown();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  });
  // A hang check (the others used to wait out the 30 s in the barrier), not a speed target.
  BOOST_TEST_REQUIRE((done.wait_for(15s) == std::future_status::ready));
  BOOST_TEST(errors[0] == "");
  BOOST_TEST(errors[1] == "the step of w1 failed");
  BOOST_TEST(errors[2] == "");
  BOOST_TEST(second.load() == 3);
  for (int r = 0; r < 3; ++r)
    BOOST_CHECK_THROW(c[r].rpc_sync<int>("w0", "add", 1, 2), corodist::usage_error);
}

// shutdown(false) closes at once: the caller's pending calls fail promptly.
BOOST_AUTO_TEST_CASE(immediate_shutdown, *utf::timeout(30)) {
  cluster c(2);
  const int entered = corodist::test::sleeps().entries();
  auto f = c[0].rpc_async<int>("w1", "co_sleep_ms", 10000);
  auto g = c[1].rpc_async<int>("w0", "co_sleep_ms", 10000);
  BOOST_TEST_REQUIRE(corodist::test::sleeps().wait_entries(entered + 2));
  c[1].shutdown(false);
  BOOST_CHECK_THROW(f.get(), corodist::connection_error); // long before its 10 s
  BOOST_CHECK_THROW(g.get(), corodist::connection_error);
  c[0].shutdown(false);
}

// Destroying agents with calls in flight (no shutdown) is safe.
BOOST_AUTO_TEST_CASE(destroy_without_shutdown, *utf::timeout(30)) {
  std::vector<corodist::future<int>> fs;
  {
    cluster c(3);
    const int entered = corodist::test::sleeps().entries();
    for (int i = 0; i < 100; ++i) {
      fs.push_back(c[i % 3].rpc_async<int>((i + 1) % 3, i % 2 ? "co_sleep_ms" : "sleep_ms", 20));
      fs.push_back(c[i % 3].rpc_async<int>((i + 2) % 3, "add", i, 1));
    }
    // Destroyed while calls run: some entered, others still on their way.
    BOOST_TEST_REQUIRE(corodist::test::sleeps().wait_entries(entered + 10));
  }
  int completed = 0;
  std::size_t ready = 0;
  for (auto& f : fs) {
    if (!f.wait_for(5s))
      continue;
    ++ready;
    try {
      f.get();
      ++completed;
    } catch (const corodist::error&) {
    }
  }
  BOOST_TEST_MESSAGE(completed << " of " << fs.size() << " calls completed before the agents went away");
  BOOST_TEST(ready == fs.size()); // the others failed: none is left hanging
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rpc_hostile)

namespace {
// A raw client of `a`'s listener that has completed the hello (no token).
asio::ip::tcp::socket raw_peer(asio::io_context& ctx, const rpc::agent& a) {
  asio::ip::tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), a.local_endpoint().port()});
  auto h = corodist::net::encode(corodist::net::hello{});
  asio::write(s, asio::buffer(h));
  std::array<std::byte, corodist::net::hello_size> back;
  asio::read(s, asio::buffer(back));
  return s;
}

// Writes one call frame `fn(arg)` with request id `id`.
template <typename A>
void send_call(asio::ip::tcp::socket& s, std::uint64_t id, std::string_view fn, const A& arg, std::error_code& ec) {
  rpc::encoder e;
  auto call = rpc::detail::encode_call(e, fn, corodist::deadline::never(), arg);
  auto h = corodist::net::encode(
      corodist::net::frame_header{static_cast<std::uint32_t>(call.body.size()), rpc::detail::kind_call, 0, id});
  std::array<asio::const_buffer, 2> frame{asio::buffer(h), asio::buffer(call.body)};
  asio::write(s, frame, ec);
}
} // namespace

// A peer that sends calls and never reads their replies has its calls held
// back once their replies fill max_buffered_output_per_peer, and is dropped
// when none of that output is written for peer_timeout, with its calls'
// memory given back; the agent goes on serving everyone else.
BOOST_AUTO_TEST_CASE(peer_that_never_reads_replies_is_dropped, *utf::timeout(60)) {
  cluster c(2, [](rpc::agent_options& o) {
    o.max_buffered_output_per_peer = 4 << 20;
    o.peer_timeout = 2s;
  });
  asio::io_context ctx;
  auto s = raw_peer(ctx, c[0]);
  // Each call asks for a 1 MiB reply; once the agent drops us, the next call
  // we send meets a closed socket and is answered with a reset.
  bool dropped = false;
  for (std::uint64_t id = 1; !dropped; ++id) { // (bounded by the test's timeout)
    std::error_code ec;
    send_call(s, id, "make_string", std::size_t{1} << 20, ec);
    pollfd p{s.native_handle(), 0, 0};
    dropped = ec || (::poll(&p, 1, 20) > 0 && (p.revents & (POLLERR | POLLHUP)));
  }
  BOOST_TEST(dropped);
  BOOST_TEST(c[1].rpc_sync<int>("w0", "add", 2, 3) == 5);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 4, 3) == 7);
}

// Flow control: once the memory held for a peer's replies is full, its calls
// are no longer started -- the agent stops reading its connection, so the
// peer's sends block -- while the agent serves everyone else; as the peer
// reads, its waiting calls start again, and every one is answered.
BOOST_AUTO_TEST_CASE(calls_of_a_peer_that_does_not_read_wait_for_its_output, *utf::timeout(120)) {
  // (The cap holds more than the worker threads' replies: calls started
  // before the first reply showed its size are not held back.)
  constexpr std::size_t cap = 8 << 20, reply = 1 << 20;
  std::atomic<int> runs{0};
  cluster c(
      2,
      [](rpc::agent_options& o) {
        o.max_buffered_output_per_peer = cap;
        o.peer_timeout = corodist::timeout::never(); // throttled for as long as the test takes
      },
      false);
  for (int r = 0; r < 2; ++r)
    c[r].register_function("counted_blob", [&runs](std::size_t n, const std::string&) {
      ++runs;
      runs.notify_all();
      return std::string(n, 'z');
    });
  c.start_all();
  asio::io_context ctx;
  auto s = raw_peer(ctx, c[0]);
  // Small socket buffers of our own (no autotuning): what the kernel holds of
  // the replies on this side stays small.
  s.set_option(asio::socket_base::receive_buffer_size(256 << 10));
  s.set_option(asio::socket_base::send_buffer_size(256 << 10));
  const std::string pad(4 << 10, 'p'); // calls of 4 KiB: many fill the socket buffers
  auto frame_of = [&](std::uint64_t id) {
    rpc::encoder e;
    auto call = rpc::detail::encode_call(e, "counted_blob", corodist::deadline::never(), reply, pad);
    auto h = corodist::net::encode(
        corodist::net::frame_header{static_cast<std::uint32_t>(call.body.size()), rpc::detail::kind_call, 0, id});
    std::vector<std::byte> f(h.begin(), h.end());
    f.insert(f.end(), call.body.begin(), call.body.end());
    return f;
  };
  // The most calls that may have run without their replies read: the cap's
  // worth, those whose replies the kernel holds (the agent's send buffer, at
  // most tcp_wmem's 4 MiB, and our 256 KiB), and the worker threads'
  // (started before the first reply showed its size).
  constexpr int bound = 8 + 4 + 1 + 4 + 4; // (and 4 to spare)
  // Calls, sent without blocking until the socket takes no more: the agent
  // has stopped reading (without flow control it reads on, and drops us once
  // the replies pass the cap: a send fails).
  std::uint64_t sent = 0;      // whole frames sent
  std::vector<std::byte> rest; // the rest of a frame sent in part
  for (;;) {
    BOOST_REQUIRE_MESSAGE(sent < 20000, "the agent reads on: " << sent << " calls sent, " << runs << " run");
    auto f = frame_of(sent + 1);
    const ssize_t n = ::send(s.native_handle(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      BOOST_REQUIRE_MESSAGE(errno == EAGAIN || errno == EWOULDBLOCK,
                            "the agent dropped a peer it throttles: " << std::strerror(errno));
      break;
    }
    if (static_cast<std::size_t>(n) < f.size()) {
      rest.assign(f.begin() + n, f.end());
      break;
    }
    ++sent;
  }
  runs.wait(0); // the agent serves us
  BOOST_TEST_MESSAGE(sent << " calls sent before the agent stopped reading; " << runs << " run");
  BOOST_TEST(sent > std::uint64_t{2} * bound); // (the bound below is not just the calls sent)
  BOOST_TEST(runs.load() <= bound);
  // The other peer is served meanwhile, on both sides.
  BOOST_TEST(c[1].rpc_sync<std::string>("w0", "counted_blob", std::size_t{16}, std::string()) == std::string(16, 'z'));
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 4, 3) == 7);
  BOOST_TEST(runs.load() <= bound + 1);
  // Reading the replies, the calls waiting start again: each is answered, and
  // those run stay within the bound of those read.
  s.non_blocking(false);
  const std::uint64_t total = sent + (rest.empty() ? 0 : 1);
  std::vector<std::byte> body;
  int worst = 0;
  for (std::uint64_t read = 0; read < total; ++read) {
    if (!rest.empty()) { // (a part the socket takes now; the reply to read next frees room)
      const ssize_t n = ::send(s.native_handle(), rest.data(), rest.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0)
        rest.erase(rest.begin(), rest.begin() + n);
    }
    if (!rest.empty() && read == sent) { // every other reply read: the agent reads again
      asio::write(s, asio::buffer(rest));
      rest.clear();
    }
    std::array<std::byte, corodist::net::header_size> h;
    asio::read(s, asio::buffer(h));
    const auto hdr = corodist::net::decode_header(h.data());
    BOOST_REQUIRE(hdr.kind == rpc::detail::kind_reply);
    body.resize(hdr.payload_len);
    asio::read(s, asio::buffer(body));
    worst = std::max(worst, runs.load() - 1 - static_cast<int>(read + 1)); // (less the other peer's call)
  }
  BOOST_TEST(worst <= bound);
  BOOST_TEST(runs.load() == static_cast<int>(total) + 1);
  s.close();
  c.shutdown_all();
}

// The caller's deadline travels with the call: calls still queued for the
// pool when their callers gave up are not started, so a later call behind
// them runs as soon as the pool is free (it used to time out behind them).
BOOST_AUTO_TEST_CASE(calls_whose_caller_gave_up_are_not_started, *utf::timeout(60)) {
  cluster c(2, [](rpc::agent_options& o) { o.worker_threads = 1; });
  auto& log = corodist::test::sleeps();
  const int entered = log.entries();
  corodist::test::holds().close();
  // The first runs (and blocks the only pool thread); the three behind it have
  // deadlines that end long before the first one's caller gives up, so once
  // that happens theirs have passed on the callee too (its clock starts a
  // little later, at arrival).
  std::vector<corodist::future<int>> held;
  held.push_back(c[0].rpc_async<int>(300ms, "w1", "hold", 0));
  for (int i = 1; i < 4; ++i)
    held.push_back(c[0].rpc_async<int>(20ms, "w1", "hold", i));
  for (auto& f : held)
    BOOST_CHECK_THROW(f.get(), corodist::timeout_error);
  auto quick = c[0].rpc_async<int>(20s, "w1", "add", 2, 3);
  corodist::test::holds().open(); // the first hold returns; the three queued behind it are skipped
  BOOST_TEST(quick.get() == 5);   // (it ran after them, on the one pool thread)
  BOOST_TEST(log.entries() == entered + 1);
  c.shutdown_all();
}

// A coroutine function is cancelled at its caller's deadline; a function that
// takes a call_context sees who called and until when.
BOOST_AUTO_TEST_CASE(coroutine_functions_are_cancelled_at_the_deadline, *utf::timeout(60)) {
  std::promise<std::string> outcome;
  cluster c(2, {}, false);
  for (int r = 0; r < 2; ++r) {
    c[r].register_function("co_forever", [&](int) -> asio::awaitable<int> {
      asio::steady_timer t(co_await asio::this_coro::executor, 1h);
      try {
        co_await t.async_wait(asio::use_awaitable);
        outcome.set_value("finished");
      } catch (const std::system_error& e) {
        outcome.set_value(e.code() == asio::error::operation_aborted ? "cancelled" : e.what());
        throw;
      }
      co_return 1;
    });
    c[r].register_function("who", [](const rpc::call_context& ctx, int x) {
      return ctx.caller() + ":" + std::to_string(x) + (ctx.deadline().is_never()
                                                             ? ":none"
                                                             : ":" + std::to_string(!ctx.expired()));
    });
  }
  c.start_all();
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(100ms, "w1", "co_forever", 1), corodist::timeout_error);
  auto o = outcome.get_future();
  BOOST_REQUIRE(o.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(o.get() == "cancelled");
  BOOST_TEST(c[0].rpc_sync<std::string>("w1", "who", 7) == "w0:7:1");
  BOOST_TEST(c[1].rpc_sync<std::string>(corodist::timeout::never(), "w0", "who", 8) == "w1:8:none");
  c.shutdown_all();
}

// A call whose arguments would decode into far more memory than they take on
// the wire (an array of N nils: each a 24-byte msgpack object for 1 byte) is
// refused before anything is built; a large array of doubles (9 bytes each on
// the wire) is not, and the agent keeps serving.
BOOST_AUTO_TEST_CASE(decoding_is_bounded_by_the_body, *utf::timeout(60)) {
  cluster c(2, {}, false);
  for (int r = 0; r < 2; ++r) {
    c[r].register_function("count_nils", [](const std::vector<msgpack::type::nil_t>& v) { return v.size(); });
    c[r].register_function("sum", [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v)
        s += x;
      return s;
    });
  }
  c.start_all();
  try {
    c[0].rpc_sync<std::size_t>("w1", "count_nils", std::vector<msgpack::type::nil_t>(4'000'000));
    BOOST_FAIL("a 4 MB call that decodes into 96 MB was accepted");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("msgpack objects") != std::string::npos, e.what());
  }
  BOOST_TEST(c[0].rpc_sync<std::size_t>("w1", "count_nils", std::vector<msgpack::type::nil_t>(1000)) == 1000u);
  std::vector<double> big(2'000'000, 0.5);
  BOOST_TEST(c[0].rpc_sync<double>("w1", "sum", big) == 1'000'000.0);
  BOOST_TEST(c[1].rpc_sync<int>("w0", "add", 1, 2) == 3);
  c.shutdown_all();
}

// Blocking entry points refuse a loop that is not running instead of hanging.
BOOST_AUTO_TEST_CASE(start_refuses_a_loop_that_is_not_running, *utf::timeout(30)) {
  event_loop store_loop;
  store_loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(store_loop.get_executor());
  event_loop idle; // never started
  rpc::agent a(idle, corodist::test::worker_options(0, 1, store));
  try {
    a.start();
    BOOST_FAIL("start() waited on a loop that is not running");
  } catch (const corodist::usage_error& e) {
    BOOST_TEST(std::string(e.what()).find("not running") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rpc_cancellation)

// A call cancelled while the callee runs it ends with operation_aborted at
// once (an rpc::cancelled_error); the cancel reaches the callee, whose
// coroutine function is cancelled at its pending wait (its result never
// comes), and the agent and its connection go on serving calls.
BOOST_AUTO_TEST_CASE(a_cancelled_call_ends_at_once_and_the_callee_is_cancelled, *utf::timeout(60)) {
  std::promise<void> entered;
  std::promise<std::string> finished;
  corodist::promise<void> release;
  corodist::shared_future<void> released = release.get_future().share();
  cluster c(2, {}, false);
  c[1].register_function("held", [&](int x) -> asio::awaitable<int> {
    entered.set_value();
    try {
      co_await released.async_get();
    } catch (const std::system_error& e) {
      finished.set_value(e.code() == asio::error::operation_aborted ? "cancelled" : e.what());
      throw;
    }
    finished.set_value("ran to its end");
    co_return x + 1;
  });
  c.start_all();
  auto& loop0 = *c.loops[0];
  asio::cancellation_signal cancel;
  auto ended = corodist::test::on_loop(
      loop0, [&] { return corodist::test::spawn_cancellable(loop0.get_executor(), c[0].call<int>("w1", "held", 41), cancel); });
  BOOST_REQUIRE(entered.get_future().wait_for(10s) == std::future_status::ready); // mid-flight at the callee
  corodist::test::on_loop(loop0, [&] { cancel.emit(asio::cancellation_type::terminal); });
  corodist::test::require_cancelled(ended);
  auto done = finished.get_future();
  BOOST_REQUIRE(done.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(done.get() == "cancelled"); // the callee's wait was cancelled
  release.set_value();
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
  c.shutdown_all();
}

BOOST_AUTO_TEST_SUITE_END()
