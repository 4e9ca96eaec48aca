// Cancellation that reaches the callee (a cancel frame), deadline propagation
// through calls made while serving a call, and call metadata.
// Linked into test_rpc (BOOST_TEST_MODULE is in test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/shared_future.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/errors.hpp>

#include "rpc/protocol.hpp"
#include "rpc/rpc_fixtures.hpp"
#include "support/cancel.hpp"
#include "support/loop_helpers.hpp"
#include "support/recorder_entries.hpp"

#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
using namespace std::chrono_literals;
using corodist::test::cluster;
using corodist::test::on_loop;
using corodist::test::recorded;
using corodist::test::with_op;

namespace {

constexpr auto as_tuple = asio::experimental::as_tuple(asio::use_awaitable);

// What a long-waiting coroutine function on the callee reports: that it
// started, and how its wait ended once its frame is gone (its resources released).
struct long_wait {
  std::promise<void> entered;
  std::promise<std::error_code> released; // set by the frame's guard, with the wait's outcome
};

// Registers "co_wait_long": a coroutine awaiting a 1-hour timer, its guard
// object reporting to `w` when the frame is destroyed.
void register_long_wait(rpc::agent& a, std::shared_ptr<long_wait> w) {
  a.register_function("co_wait_long", [w](int v) -> asio::awaitable<int> {
    struct guard {
      std::shared_ptr<long_wait> w;
      std::error_code ec = make_error_code(std::errc::timed_out); // (not cancelled: left as is)
      ~guard() { w->released.set_value(ec); }
    } g{w};
    w->entered.set_value();
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
    auto [ec] = co_await t.async_wait(as_tuple);
    g.ec = ec;
    co_return v;
  });
}

// Fails the test unless `e` is an rpc::cancelled_error (operation_aborted).
void require_cancelled_error(std::exception_ptr e) {
  BOOST_REQUIRE_MESSAGE(e, "the call completed instead of ending cancelled");
  try {
    std::rethrow_exception(e);
  } catch (const rpc::cancelled_error& x) {
    BOOST_TEST(x.code() == asio::error::operation_aborted);
  } catch (const std::exception& x) {
    BOOST_FAIL(std::string("expected rpc::cancelled_error, got ") + typeid(x).name() + ": " + x.what());
  }
}

// The milliseconds left of the deadline of the call being served (-1: none).
std::int64_t left_ms(const rpc::call_context& ctx) {
  if (ctx.deadline().is_never())
    return -1;
  return std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline().remaining()).count();
}

// Waits up to 10 s for a std::future.
template <typename T>
bool ready(std::future<T>& f) {
  return f.wait_for(10s) == std::future_status::ready;
}

// The error type of the (one) entry with op `op` and function `fn` of `name`'s recorder.
std::string recorded_failure(const std::string& name, const std::string& op, const std::string& fn) {
  for (const auto& e : with_op(recorded("rpc", name), op))
    if (e.at("detail").get<std::string>().rfind(fn, 0) == 0)
      return e.at("state").get<std::string>() + "/" +
             (e.contains("error_type") ? e.at("error_type").get<std::string>() : std::string());
  return "none";
}

} // namespace

BOOST_AUTO_TEST_SUITE(rpc_cancel)

// Cancelling the coroutine awaiting call() (through the slot co_spawn binds)
// ends the await at once with cancelled_error, and the callee's coroutine
// function's pending wait ends with operation_aborted: its frame is
// destroyed, releasing what it held. Both sides record the call cancelled;
// the connection goes on serving.
BOOST_AUTO_TEST_CASE(cancelling_the_awaiting_coroutine_cancels_the_callee, *utf::timeout(60)) {
  auto w = std::make_shared<long_wait>();
  cluster c(2, {}, false);
  register_long_wait(c[1], w);
  c.start_all();
  auto& loop0 = *c.loops[0];
  asio::cancellation_signal cancel;
  auto ended = on_loop(loop0, [&] {
    return corodist::test::spawn_cancellable(loop0.get_executor(), c[0].call<int>("w1", "co_wait_long", 1), cancel);
  });
  auto entered = w->entered.get_future();
  BOOST_REQUIRE(ready(entered)); // mid-flight on the callee
  on_loop(loop0, [&] { cancel.emit(asio::cancellation_type::terminal); });
  BOOST_REQUIRE(ended.wait_for(10s) == std::future_status::ready);
  require_cancelled_error(ended.get());
  auto released = w->released.get_future();
  BOOST_REQUIRE(ready(released));
  BOOST_TEST(released.get() == asio::error::operation_aborted);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
  c.shutdown_all(); // (every call ended: the entries are final)
  BOOST_TEST(recorded_failure("w0", "call", "co_wait_long") == "failed/cancelled");
  BOOST_TEST(recorded_failure("w1", "serve", "co_wait_long") == "failed/cancelled");
}

// The same through Asio's awaitable operators: `call || other` cancels the
// call when the other branch finishes first (here: an event the test sets).
BOOST_AUTO_TEST_CASE(losing_an_awaitable_race_cancels_the_callee, *utf::timeout(60)) {
  using namespace asio::experimental::awaitable_operators;
  auto w = std::make_shared<long_wait>();
  cluster c(2, {}, false);
  register_long_wait(c[1], w);
  c.start_all();
  auto& loop0 = *c.loops[0];
  corodist::promise<void> go;
  auto gone = go.get_future();
  std::promise<std::size_t> winner;
  auto race = [&]() -> asio::awaitable<void> {
    auto r = co_await (c[0].call<int>("w1", "co_wait_long", 1) || gone.async_wait());
    winner.set_value(r.index());
  };
  on_loop(loop0, [&] { asio::co_spawn(loop0.get_executor(), race(), asio::detached); });
  auto entered = w->entered.get_future();
  BOOST_REQUIRE(ready(entered));
  go.set_value();
  auto won = winner.get_future();
  BOOST_REQUIRE(ready(won));
  BOOST_TEST(won.get() == 1u);
  auto released = w->released.get_future();
  BOOST_REQUIRE(ready(released));
  BOOST_TEST(released.get() == asio::error::operation_aborted);
  BOOST_TEST(c[0].rpc_sync<int>("w1", "co_add", 2, 3) == 5);
  c.shutdown_all();
}

// future::cancel() on rpc_async's future (from a plain thread): the future
// fails with cancelled_error and the callee's coroutine is cancelled. A
// second cancel, and a cancel of a call that has finished, change nothing.
BOOST_AUTO_TEST_CASE(cancel_on_the_future_reaches_the_callee, *utf::timeout(60)) {
  auto w = std::make_shared<long_wait>();
  cluster c(2, {}, false);
  register_long_wait(c[1], w);
  c.start_all();
  auto f = c[0].rpc_async<int>("w1", "co_wait_long", 7);
  auto entered = w->entered.get_future();
  BOOST_REQUIRE(ready(entered));
  f.cancel();
  f.cancel();
  BOOST_REQUIRE(f.wait_for(10s));
  std::exception_ptr e;
  try {
    f.get();
  } catch (...) {
    e = std::current_exception();
  }
  require_cancelled_error(e);
  auto released = w->released.get_future();
  BOOST_REQUIRE(ready(released));
  BOOST_TEST(released.get() == asio::error::operation_aborted);
  auto done = c[0].rpc_async<int>("w1", "add", 1, 2);
  BOOST_REQUIRE(done.wait_for(10s));
  done.cancel(); // finished: nothing to cancel, the value stays
  BOOST_TEST(done.get() == 3);
  c.shutdown_all();
  BOOST_TEST(recorded_failure("w0", "call", "co_wait_long") == "failed/cancelled");
  BOOST_TEST(recorded_failure("w1", "serve", "co_wait_long") == "failed/cancelled");
}

// A plain function polls call_context::cancelled() and returns early; the
// caller gets cancelled_error; a call made on the same connection while the
// function runs completes normally.
BOOST_AUTO_TEST_CASE(a_plain_function_sees_cancelled_and_returns_early, *utf::timeout(60)) {
  std::promise<void> entered;
  std::promise<bool> returned; // whether it saw the cancel (false: it gave up after 30 s)
  cluster c(2, {}, false);
  c[1].register_function("poll_cancel", [&](const rpc::call_context& ctx) {
    entered.set_value();
    const auto give_up = std::chrono::steady_clock::now() + 30s; // (a bound for a broken build)
    while (!ctx.cancelled() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(1ms);
    returned.set_value(ctx.cancelled());
    return -1;
  });
  c.start_all();
  auto f = c[0].rpc_async<int>("w1", "poll_cancel");
  auto in = entered.get_future();
  BOOST_REQUIRE(ready(in));
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 20, 22) == 42); // the same connection, meanwhile
  f.cancel();
  BOOST_REQUIRE(f.wait_for(10s));
  std::exception_ptr e;
  try {
    f.get();
  } catch (...) {
    e = std::current_exception();
  }
  require_cancelled_error(e);
  auto back = returned.get_future();
  BOOST_REQUIRE(ready(back));
  BOOST_TEST(back.get());
  BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 1, 1) == 2);
  c.shutdown_all();
  BOOST_TEST(recorded_failure("w1", "serve", "poll_cancel") == "failed/cancelled");
}

// A cancel frame for a request id that is not running (never sent, or
// finished) is ignored: the connection goes on (a raw peer sends it).
BOOST_AUTO_TEST_CASE(a_cancel_for_an_unknown_call_is_ignored, *utf::timeout(60)) {
  cluster c(2);
  asio::io_context ctx;
  asio::ip::tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), c[0].local_endpoint().port()});
  auto hello = corodist::net::encode(corodist::net::hello{});
  asio::write(s, asio::buffer(hello));
  std::array<std::byte, corodist::net::hello_size> back;
  asio::read(s, asio::buffer(back));
  std::array<std::byte, 8> id;
  corodist::store_le(id.data(), std::uint64_t{12345});
  auto h = corodist::net::encode(corodist::net::frame_header{8, rpc::detail::kind_cancel,
                                                             corodist::net::frame_flags::one_way, 0});
  std::array<asio::const_buffer, 2> frame{asio::buffer(h), asio::buffer(id)};
  asio::write(s, frame);
  rpc::encoder e;
  auto call = rpc::detail::encode_call(e, "add", corodist::deadline::never(), 2, 5);
  auto ch = corodist::net::encode(
      corodist::net::frame_header{static_cast<std::uint32_t>(call.body.size()), rpc::detail::kind_call, 0, 1});
  std::array<asio::const_buffer, 2> call_frame{asio::buffer(ch), asio::buffer(call.body)};
  asio::write(s, call_frame);
  std::array<std::byte, corodist::net::header_size> rh;
  asio::read(s, asio::buffer(rh));
  const auto hdr = corodist::net::decode_header(rh.data());
  BOOST_TEST(hdr.kind == rpc::detail::kind_reply);
  BOOST_TEST(hdr.request_id == 1u);
  std::vector<std::byte> body(hdr.payload_len);
  asio::read(s, asio::buffer(body));
  BOOST_TEST(c[1].rpc_sync<int>("w0", "add", 2, 3) == 5);
  s.close();
  c.shutdown_all();
}

// A -> B -> C: cancelling A's call cancels B's coroutine function, whose
// await of its own call to C ends with the cancellation, which cancels C's.
BOOST_AUTO_TEST_CASE(a_cancel_reaches_the_calls_the_callee_awaits, *utf::timeout(60)) {
  auto w = std::make_shared<long_wait>();
  std::promise<bool> middle; // whether B's await ended with cancelled_error
  cluster c(3, {}, false);
  register_long_wait(c[2], w);
  c[1].register_function("co_forward", [&c, &middle]() -> asio::awaitable<int> {
    try {
      co_return co_await c[1].call<int>("w2", "co_wait_long", 3);
    } catch (const rpc::cancelled_error&) {
      middle.set_value(true);
      throw;
    } catch (...) {
      middle.set_value(false);
      throw;
    }
  });
  c.start_all();
  auto f = c[0].rpc_async<int>("w1", "co_forward");
  auto entered = w->entered.get_future();
  BOOST_REQUIRE(ready(entered)); // C runs it
  f.cancel();
  BOOST_REQUIRE(f.wait_for(10s));
  BOOST_CHECK_THROW(f.get(), rpc::cancelled_error);
  auto mid = middle.get_future();
  BOOST_REQUIRE(ready(mid));
  BOOST_TEST(mid.get());
  auto released = w->released.get_future();
  BOOST_REQUIRE(ready(released));
  BOOST_TEST(released.get() == asio::error::operation_aborted);
  c.shutdown_all();
}

// Calls made while serving a call keep within its deadline (as gRPC
// propagates deadlines), from a coroutine function and from a plain one: the
// grandchild sees a deadline no later than the served call's, also when the
// child call asks for a longer limit; propagate_deadline = false opts out.
BOOST_AUTO_TEST_CASE(calls_made_while_serving_inherit_the_deadline, *utf::timeout(60)) {
  cluster c(3, {}, false); // rpc_timeout 30 s
  c[2].register_function("left_ms", [](const rpc::call_context& ctx) { return left_ms(ctx); });
  c[1].register_function("co_child", [&c](int how) -> asio::awaitable<std::int64_t> {
    if (how == 0)
      co_return co_await c[1].call<std::int64_t>("w2", "left_ms");
    if (how == 1)
      co_return co_await c[1].call<std::int64_t>(60s, "w2", "left_ms");
    const rpc::call_options own{.timeout = 40s, .propagate_deadline = false};
    co_return co_await c[1].call<std::int64_t>(own, "w2", "left_ms");
  });
  c[1].register_function("child", [&c](int how) {
    if (how == 0)
      return c[1].rpc_sync<std::int64_t>("w2", "left_ms");
    if (how == 1)
      return c[1].rpc_async<std::int64_t>(60s, "w2", "left_ms").get();
    const rpc::call_options own{.timeout = 40s, .propagate_deadline = false};
    return c[1].rpc_sync<std::int64_t>(own, "w2", "left_ms");
  });
  c.start_all();
  for (const char* fn : {"co_child", "child"}) {
    BOOST_TEST_CONTEXT(fn) {
      for (int how = 0; how < 2; ++how) {
        const auto left = c[0].rpc_sync<std::int64_t>(5s, "w1", fn, how);
        BOOST_TEST(left > 0);
        BOOST_TEST(left <= 5000);
      }
      const auto own = c[0].rpc_sync<std::int64_t>(5s, "w1", fn, 2);
      BOOST_TEST(own > 30000); // its own 40 s
      BOOST_TEST(own <= 40000);
    }
  }
  // Outside any served call: a call's own limit only.
  const auto plain = c[0].rpc_sync<std::int64_t>("w2", "left_ms");
  BOOST_TEST(plain > 5000);
  BOOST_TEST(plain <= 30000);
  c.shutdown_all();
}

// Many coroutine functions interleave on one loop, each between its
// suspensions calling on with its own served call's deadline: every
// grandchild sees its own parent's deadline (3 s apart from the next one's),
// not another's.
BOOST_AUTO_TEST_CASE(interleaved_coroutine_functions_keep_their_own_deadlines, *utf::timeout(120)) {
  constexpr int n = 24;
  cluster c(3, [](rpc::agent_options& o) { o.rpc_timeout = 200s; }, false); // (over every parent's)
  std::atomic<int> waiting{0};
  corodist::promise<void> all_in;
  auto gate = all_in.get_future().share();
  c[2].register_function("left_ms", [](const rpc::call_context& ctx) { return left_ms(ctx); });
  c[1].register_function("co_interleaved", [&]() -> asio::awaitable<std::vector<std::int64_t>> {
    if (++waiting == n)
      all_in.set_value();
    co_await gate.async_wait(); // every one suspended here before any goes on
    std::vector<std::int64_t> seen;
    seen.push_back(co_await c[1].call<std::int64_t>("w2", "left_ms"));
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms); // (another suspension, another resumption)
    co_await t.async_wait(asio::use_awaitable);
    seen.push_back(co_await c[1].call<std::int64_t>("w2", "left_ms"));
    co_return seen;
  });
  c.start_all();
  std::vector<corodist::future<std::vector<std::int64_t>>> fs;
  for (int i = 0; i < n; ++i)
    fs.push_back(c[0].rpc_async<std::vector<std::int64_t>>(std::chrono::seconds(10 + 3 * i), "w1", "co_interleaved"));
  for (int i = 0; i < n; ++i) {
    const auto seen = fs[static_cast<std::size_t>(i)].get();
    const std::int64_t own = 1000 * (10 + 3 * i);
    BOOST_REQUIRE_EQUAL(seen.size(), 2u);
    for (auto left : seen) {
      BOOST_TEST_CONTEXT("call " << i) {
        BOOST_TEST(left <= own);
        BOOST_TEST(left > own - 3000); // not the previous call's (3 s less)
      }
    }
  }
  c.shutdown_all();
}

// Metadata headers travel with the call to both kinds of functions (in
// order; header() finds the first by key), and the served call's
// flight-recorder entry carries a "trace-id" header.
BOOST_AUTO_TEST_CASE(metadata_reaches_the_callee, *utf::timeout(60)) {
  using headers = std::vector<std::pair<std::string, std::string>>;
  cluster c(2, {}, false);
  c[1].register_function("headers", [](const rpc::call_context& ctx) {
    headers out(ctx.metadata().begin(), ctx.metadata().end());
    out.emplace_back("found", std::string(ctx.header("trace-id").value_or("<none>")));
    return out;
  });
  c[1].register_function("co_header", [](rpc::call_context ctx, std::string key) -> asio::awaitable<std::string> {
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
    co_await t.async_wait(asio::use_awaitable); // (the context outlives a suspension)
    co_return std::string(ctx.header(key).value_or("<none>"));
  });
  c.start_all();
  const rpc::call_options opts{.metadata = {{"trace-id", "abc123"}, {"tenant", "t1"}, {"tenant", "t2"}}};
  const auto got = c[0].rpc_sync<headers>(opts, "w1", "headers");
  BOOST_REQUIRE_EQUAL(got.size(), 4u);
  BOOST_TEST(got[0].first == "trace-id");
  BOOST_TEST(got[0].second == "abc123");
  BOOST_TEST(got[2].second == "t2");
  BOOST_TEST(got[3].second == "abc123");
  auto co = c[0].rpc_async<std::string>(opts, "w1", "co_header", std::string("tenant"));
  BOOST_TEST(co.get() == "t1");
  auto& loop0 = *c.loops[0];
  std::promise<std::string> from_call;
  on_loop(loop0, [&] {
    asio::co_spawn(
        loop0.get_executor(),
        [&]() -> asio::awaitable<void> {
          from_call.set_value(co_await c[0].call<std::string>(opts, "w1", "co_header", std::string("trace-id")));
        },
        asio::detached);
  });
  auto fc = from_call.get_future();
  BOOST_REQUIRE(ready(fc));
  BOOST_TEST(fc.get() == "abc123");
  // None given: none there.
  BOOST_TEST(c[0].rpc_sync<headers>("w1", "headers").size() == 1u);
  c.shutdown_all();
  bool traced = false;
  for (const auto& e : with_op(recorded("rpc", "w1"), "serve"))
    traced = traced || e.at("detail") == "headers trace-id=abc123";
  BOOST_TEST(traced);
}

// Metadata over max_metadata_bytes: the caller refuses it (usage_error, in
// the future for rpc_async, nothing sent); a foreign caller that sends more
// gets an error reply naming the limit, and the connection goes on.
BOOST_AUTO_TEST_CASE(oversized_metadata_is_refused, *utf::timeout(60)) {
  cluster c(2);
  const rpc::call_options big{.metadata = {{"blob", std::string(rpc::max_metadata_bytes, 'x')}}};
  BOOST_CHECK_THROW(c[0].rpc_sync<int>(big, "w1", "add", 1, 2), corodist::usage_error);
  auto f = c[0].rpc_async<int>(big, "w1", "add", 1, 2);
  BOOST_CHECK_THROW(f.get(), corodist::usage_error);
  const rpc::call_options fits{.metadata = {{"blob", std::string(rpc::max_metadata_bytes - 4, 'x')}}};
  BOOST_TEST(c[0].rpc_sync<int>(fits, "w1", "add", 1, 2) == 3);
  // A foreign caller (no check on its side): the callee answers with an error.
  asio::io_context ctx;
  asio::ip::tcp::socket s(ctx);
  s.connect({asio::ip::make_address("127.0.0.1"), c[0].local_endpoint().port()});
  auto hello = corodist::net::encode(corodist::net::hello{});
  asio::write(s, asio::buffer(hello));
  std::array<std::byte, corodist::net::hello_size> back;
  asio::read(s, asio::buffer(back));
  rpc::encoder e;
  auto call = rpc::detail::encode_call_with_metadata(e, "add", corodist::deadline::never(), &big.metadata, 1, 2);
  auto h = corodist::net::encode(
      corodist::net::frame_header{static_cast<std::uint32_t>(call.body.size()), rpc::detail::kind_call, 0, 9});
  std::array<asio::const_buffer, 2> frame{asio::buffer(h), asio::buffer(call.body)};
  asio::write(s, frame);
  std::array<std::byte, corodist::net::header_size> rh;
  asio::read(s, asio::buffer(rh));
  const auto hdr = corodist::net::decode_header(rh.data());
  BOOST_TEST(hdr.kind == rpc::detail::kind_error_reply);
  BOOST_TEST(hdr.request_id == 9u);
  std::vector<std::byte> body(hdr.payload_len);
  asio::read(s, asio::buffer(body));
  const std::string text(reinterpret_cast<const char*>(body.data()), body.size());
  BOOST_TEST(text.find("metadata") != std::string::npos);
  BOOST_TEST(text.find(std::to_string(rpc::max_metadata_bytes)) != std::string::npos);
  s.close();
  BOOST_TEST(c[1].rpc_sync<int>("w0", "add", 2, 3) == 5);
  c.shutdown_all();
}

// call() sends at once, before its awaitable is awaited: two calls made
// first and awaited after both run on the callee together (a function that
// returns only once both have arrived), each awaitable then giving its own
// value. A call that cannot be sent fails when awaited.
BOOST_AUTO_TEST_CASE(a_call_is_sent_when_made_and_awaited_later, *utf::timeout(60)) {
  cluster c(2, {}, false);
  auto arrived = std::make_shared<int>(0);
  corodist::promise<void> both_set;
  auto both = both_set.get_future().share();
  c[1].register_function("meet", [arrived, both, &both_set](int v) -> asio::awaitable<int> {
    if (++*arrived == 2)
      both_set.set_value();
    co_await both.async_wait(asio::use_awaitable);
    co_return v * 10;
  });
  c.start_all();
  auto& loop0 = *c.loops[0];
  std::promise<std::pair<int, int>> values;
  std::promise<std::string> unsent;
  auto run = [&]() -> asio::awaitable<void> {
    auto first = c[0].call<int>(20s, "w1", "meet", 1);
    auto second = c[0].call<int>(20s, "w1", "meet", 2);
    const int a = co_await std::move(first);
    const int b = co_await std::move(second);
    values.set_value({a, b});
    auto nowhere = c[0].call<int>("nobody", "meet", 3);
    try {
      co_await std::move(nowhere);
      unsent.set_value("it completed");
    } catch (const corodist::usage_error& e) {
      unsent.set_value(e.what());
    }
  };
  on_loop(loop0, [&] { asio::co_spawn(loop0.get_executor(), run(), asio::detached); });
  auto got = values.get_future();
  BOOST_REQUIRE(ready(got));
  const auto [a, b] = got.get();
  BOOST_TEST(a == 10);
  BOOST_TEST(b == 20);
  auto why = unsent.get_future();
  BOOST_REQUIRE(ready(why));
  const auto text = why.get();
  BOOST_TEST(text.find("nobody") != std::string::npos, text);
  c.shutdown_all();
}

BOOST_AUTO_TEST_SUITE_END()
