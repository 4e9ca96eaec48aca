// RPC streams between agents of one process (each on its own loop, over real
// sockets): server streams, bidirectional and client streams, items with
// attachments, errors in order after the items, the credit window bounding a
// writer whose reader stalls, deadlines, cancellation from either end, a lost
// peer, and calls on the same connection going on meanwhile. Linked into the
// rpc test executable (BOOST_TEST_MODULE is in test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/errors.hpp>

#include "rpc/rpc_fixtures.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>
#include <cctype>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
using corodist::event_loop;
using corodist::test::cluster;

namespace {

// What the stream functions of one test report: each an event the test waits
// for (a promise), never a guess at how long something takes.
struct probes {
  std::promise<std::error_code> aborted;     // a waiting handler's pending operation ended (its code)
  std::promise<bool> saw_cancelled;          // ... and its call_context::cancelled() then
  std::promise<std::string> write_failed;    // a writing handler's write threw (the exception's type)
  std::promise<rpc::stream_stats> stalled;   // the window was spent: the writer's counters then
  std::atomic<int> written{0};               // items a writing handler has written
  std::promise<void> release_hold;           // lets "held" write its item
  std::shared_future<void> hold = release_hold.get_future().share();
};
probes* current = nullptr;

// Waits (bounded) until `pred` holds: for counters that change on another
// loop once an event the test caused has been handled there.
bool eventually(const std::function<bool()>& pred, std::chrono::seconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

void register_streams(rpc::agent& a) {
  // 0 .. n-1, then the end.
  a.register_stream("count", [](rpc::stream_writer<int>& w, int n) -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i)
      co_await w.write(i);
  });
  // The caller's metadata, one "key=value" item each.
  a.register_stream("headers",
                    [](const rpc::call_context& ctx, rpc::stream_writer<std::string>& w) -> asio::awaitable<void> {
                      for (auto& [k, v] : ctx.metadata())
                        co_await w.write(k + "=" + v);
                    });
  // `n` attachments of `size` bytes, byte j of item i being (i + j) % 251.
  a.register_stream("blobs", [](rpc::stream_writer<corodist::test::point>& w, int n,
                                std::size_t size) -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i) {
      std::vector<std::byte> b(size);
      for (std::size_t j = 0; j < size; ++j)
        b[j] = std::byte(static_cast<unsigned char>((static_cast<std::size_t>(i) + j) % 251));
      corodist::test::point p;
      p.x = i;
      p.blob = rpc::attachment(std::move(b));
      co_await w.write(p);
    }
  });
  // `n` items, then a throw.
  a.register_stream("fail_after", [](rpc::stream_writer<int>& w, int n) -> asio::awaitable<void> {
    for (int i = 0; i < n; ++i)
      co_await w.write(i);
    throw corodist::test::custom_failure("broke after " + std::to_string(n));
  });
  // One item, then waits (for an hour) and reports how the wait ended.
  a.register_stream("wait_forever", [](const rpc::call_context& ctx,
                                       rpc::stream_writer<int>& w) -> asio::awaitable<void> {
    co_await w.write(1);
    asio::steady_timer t(co_await asio::this_coro::executor, 1h);
    auto [ec] = co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    current->saw_cancelled.set_value(ctx.cancelled());
    current->aborted.set_value(ec);
  });
  // Writes until a write fails; reports what it threw. At the first write
  // that finds the window spent, reports the writer's counters.
  a.register_stream("firehose", [](rpc::stream_writer<int>& w, int n) -> asio::awaitable<void> {
    bool reported = false;
    try {
      for (int i = 0; i < n; ++i) {
        if (!w.has_credit() && !reported) {
          reported = true;
          current->stalled.set_value(w.stats());
        }
        co_await w.write(i);
        ++current->written;
      }
    } catch (const rpc::cancelled_error&) {
      current->write_failed.set_value("cancelled_error");
      throw;
    } catch (const std::system_error& e) {
      current->write_failed.set_value(e.code() == asio::error::operation_aborted ? "operation_aborted" : "system_error");
      throw;
    }
  });
  // As firehose, with strings of `pad` bytes (the bytes window).
  a.register_stream("padded", [](rpc::stream_writer<std::string>& w, int n, std::size_t pad) -> asio::awaitable<void> {
    bool reported = false;
    for (int i = 0; i < n; ++i) {
      if (!w.has_credit() && !reported) {
        reported = true;
        current->stalled.set_value(w.stats());
      }
      co_await w.write(std::string(pad, static_cast<char>('a' + i % 26)));
      ++current->written;
    }
  });
  // One item of `n` nils (a byte each on the wire, a msgpack object each decoded).
  a.register_stream("nils", [](rpc::stream_writer<std::vector<msgpack::type::nil_t>>& w,
                               int n) -> asio::awaitable<void> {
    co_await w.write(std::vector<msgpack::type::nil_t>(static_cast<std::size_t>(n)));
  });
  // Two items, then cancels from the writing end.
  a.register_stream("cancel_after_two", [](rpc::stream_writer<int>& w) -> asio::awaitable<void> {
    co_await w.write(1);
    co_await w.write(2);
    w.cancel();
  });
  // Writes one item once the test releases it.
  a.register_stream("held", [](rpc::stream_writer<int>& w) -> asio::awaitable<void> {
    while (current->hold.wait_for(0s) != std::future_status::ready) {
      asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    co_await w.write(42);
  });
  // Bidirectional: each string back in upper case.
  a.register_stream("upper", [](rpc::stream_reader<std::string>& r,
                                rpc::stream_writer<std::string>& w) -> asio::awaitable<void> {
    while (auto s = co_await r.next()) {
      for (auto& c : *s)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      co_await w.write(*s);
    }
  });
  // Client streaming: the sum of what arrives, once the client closes.
  a.register_stream("sum", [](const rpc::call_context&, rpc::stream_reader<long>& r, rpc::stream_writer<long>& w,
                              long start) -> asio::awaitable<void> {
    long total = start;
    while (auto v = co_await r.next())
      total += *v;
    co_await w.write(total);
  });
}

// A cluster of `n` agents offering the test streams.
std::unique_ptr<cluster> stream_cluster(int n, const std::function<void(rpc::agent_options&)>& tweak = {}) {
  auto c = std::make_unique<cluster>(n, tweak, /*start=*/false);
  for (auto& a : c->agents)
    register_streams(*a);
  c->start_all();
  return c;
}

template <typename T>
T run_on(cluster& c, int rank, asio::awaitable<T> op) {
  return corodist::run_blocking(c.loops[static_cast<std::size_t>(rank)]->get_executor(), std::move(op));
}

} // namespace

BOOST_AUTO_TEST_SUITE(rpc_streams)

BOOST_AUTO_TEST_CASE(server_stream_read_from_a_plain_thread, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>("w1", "count", 5);
  for (int i = 0; i < 5; ++i) {
    auto v = r.next_sync();
    BOOST_REQUIRE(v);
    BOOST_TEST(*v == i);
  }
  BOOST_TEST(!r.next_sync());
  BOOST_TEST(!r.next_sync()); // the end stays the end
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
  // An empty stream ends at once.
  auto empty = (*c)[0].open_stream<int>("w1", "count", 0);
  BOOST_TEST(!empty.next_sync());
}

BOOST_AUTO_TEST_CASE(many_items_in_order_from_a_coroutine, *utf::timeout(120)) {
  auto c = stream_cluster(2);
  constexpr int n = 200000;
  auto& a = (*c)[0];
  const long long sum = run_on(*c, 0, [&]() -> asio::awaitable<long long> {
    auto r = a.open_stream<int>("w1", "count", n);
    long long s = 0;
    int expect = 0;
    while (auto v = co_await r.next()) {
      if (*v != expect)
        throw std::runtime_error("item " + std::to_string(expect) + " came as " + std::to_string(*v));
      ++expect;
      s += *v;
    }
    co_return s;
  }());
  BOOST_TEST(sum == static_cast<long long>(n) * (n - 1) / 2);
}

BOOST_AUTO_TEST_CASE(metadata_reaches_the_call_context, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  rpc::stream_options o;
  o.metadata = {{"trace-id", "abc123"}, {"tenant", "t7"}};
  auto r = (*c)[0].open_stream<std::string>(o, "w1", "headers");
  BOOST_TEST(r.next_sync().value_or("") == "trace-id=abc123");
  BOOST_TEST(r.next_sync().value_or("") == "tenant=t7");
  BOOST_TEST(!r.next_sync());
}

BOOST_AUTO_TEST_CASE(items_carry_attachments, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  constexpr std::size_t size = 64 * 1024 + 3;
  auto r = (*c)[0].open_stream<corodist::test::point>("w1", "blobs", 20, size);
  for (int i = 0; i < 20; ++i) {
    auto p = r.next_sync();
    BOOST_REQUIRE(p);
    BOOST_TEST(p->x == i);
    BOOST_REQUIRE(p->blob.size() == size);
    bool same = true;
    for (std::size_t j = 0; j < size; ++j)
      same = same && p->blob.data()[j] == std::byte(static_cast<unsigned char>((static_cast<std::size_t>(i) + j) % 251));
    BOOST_TEST(same);
  }
  BOOST_TEST(!r.next_sync());
}

BOOST_AUTO_TEST_CASE(handler_error_comes_after_the_items, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>("w1", "fail_after", 3);
  for (int i = 0; i < 3; ++i)
    BOOST_TEST(r.next_sync().value_or(-1) == i);
  try {
    r.next_sync();
    BOOST_FAIL("no error after the items");
  } catch (const corodist::remote_error& e) {
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.type().find("custom_failure") != std::string::npos);
    BOOST_TEST(e.message() == "broke after 3");
  }
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
}

BOOST_AUTO_TEST_CASE(unknown_function_and_wrong_mode_fail_the_reader, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>("w1", "no_such_stream");
  BOOST_CHECK_THROW(r.next_sync(), rpc::unknown_function_error);
  auto b = (*c)[0].open_stream<std::string>("w1", "upper"); // bidirectional, opened as a server stream
  BOOST_CHECK_THROW(b.next_sync(), rpc::bad_arguments_error);
  auto bad_args = (*c)[0].open_stream<int>("w1", "count", std::string("not an int"));
  BOOST_CHECK_THROW(bad_args.next_sync(), rpc::bad_arguments_error);
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
}

BOOST_AUTO_TEST_CASE(decoding_is_bounded_by_the_frame, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  // 100,000 nils: 100 KB on the wire, 2.4 MB decoded: within the 16 MiB floor.
  auto ok = (*c)[0].open_stream<std::vector<msgpack::type::nil_t>>("w1", "nils", 100000);
  BOOST_TEST(ok.next_sync().value_or(std::vector<msgpack::type::nil_t>{}).size() == 100000u);
  BOOST_TEST(!ok.next_sync());
  // 1,000,000 nils: 1 MB on the wire would be 24 MB of objects, over max(4 MB, 16 MiB).
  auto big = (*c)[0].open_stream<std::vector<msgpack::type::nil_t>>("w1", "nils", 1000000);
  try {
    big.next_sync();
    BOOST_FAIL("the frame was decoded past its bound");
  } catch (const corodist::protocol_error& e) {
    BOOST_TEST(std::string(e.what()).find("msgpack objects") != std::string::npos, e.what());
  }
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
  BOOST_TEST((*c)[0].rpc_sync<int>("w1", "add", 1, 2) == 3); // the connection is unharmed
}

BOOST_AUTO_TEST_CASE(deadline_fails_the_reader_and_cancels_the_handler, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>(300ms, "w1", "wait_forever");
  BOOST_TEST(r.next_sync().value_or(0) == 1);
  BOOST_CHECK_THROW(r.next_sync(), corodist::timeout_error);
  auto f = p.aborted.get_future();
  BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(f.get() == std::error_code(asio::error::operation_aborted));
  BOOST_TEST(!p.saw_cancelled.get_future().get()); // the deadline, not a cancel
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
  BOOST_TEST((*c)[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(reader_cancel_reaches_a_waiting_handler, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>(corodist::timeout::never(), "w1", "wait_forever");
  BOOST_TEST(r.next_sync().value_or(0) == 1);
  r.cancel();
  auto f = p.aborted.get_future();
  BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(f.get() == std::error_code(asio::error::operation_aborted));
  BOOST_TEST(p.saw_cancelled.get_future().get()); // call_context::cancelled() says so too
  BOOST_CHECK_THROW(r.next_sync(), rpc::cancelled_error);
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
  BOOST_TEST((*c)[0].rpc_sync<int>("w1", "add", 1, 1) == 2);
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(dropping_the_reader_cancels_a_writing_handler, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2, [](rpc::agent_options& o) { o.stream_window_items = 16; });
  {
    auto r = (*c)[0].open_stream<int>(corodist::timeout::never(), "w1", "firehose", 1 << 30);
    for (int i = 0; i < 100; ++i)
      BOOST_TEST(r.next_sync().value_or(-1) == i);
  } // dropped mid-stream
  auto f = p.write_failed.get_future();
  BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
  const auto how = f.get();
  BOOST_TEST((how == "cancelled_error" || how == "operation_aborted"), how);
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(writer_cancel_reaches_the_reader, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>("w1", "cancel_after_two");
  int items = 0;
  try {
    while (r.next_sync())
      ++items;
    BOOST_FAIL("the stream ended instead of being cancelled");
  } catch (const rpc::cancelled_error& e) {
    BOOST_TEST(std::string(e.what()).find("cancelled by worker 'w1'") != std::string::npos, e.what());
  }
  BOOST_TEST(items <= 2);
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
}

BOOST_AUTO_TEST_CASE(cancelling_an_await_of_next_keeps_the_stream, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2);
  auto& a = (*c)[0];
  auto r = a.open_stream<int>("w1", "held");
  const bool timer_won = run_on(*c, 0, [&]() -> asio::awaitable<bool> {
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer t(co_await asio::this_coro::executor, 20ms);
    auto v = co_await (r.next() || t.async_wait(asio::use_awaitable));
    co_return v.index() == 1;
  }());
  BOOST_TEST(timer_won); // the handler writes nothing before the release below
  p.release_hold.set_value();
  BOOST_TEST(r.next_sync().value_or(0) == 42);
  BOOST_TEST(!r.next_sync());
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(stalled_reader_bounds_the_writer, *utf::timeout(60)) {
  probes p;
  current = &p;
  constexpr std::size_t window = 8;
  auto c = stream_cluster(2, [](rpc::agent_options& o) { o.stream_window_items = window; });
  constexpr int n = 200;
  auto r = (*c)[0].open_stream<int>("w1", "firehose", n);
  // The reader reads nothing: the writer stops at the window.
  auto stalled = p.stalled.get_future();
  BOOST_REQUIRE(stalled.wait_for(10s) == std::future_status::ready);
  const auto s = stalled.get();
  BOOST_TEST(s.items_unacknowledged == window);
  BOOST_TEST(s.items_sent + s.items_batched == window);
  BOOST_TEST(p.written.load() == static_cast<int>(window));
  // A call on the same connection goes through meanwhile.
  BOOST_TEST((*c)[0].rpc_sync<int>("w1", "add", 20, 22) == 42);
  BOOST_TEST(p.written.load() == static_cast<int>(window)); // still held at the window
  // Reading again lets it go on to the end.
  for (int i = 0; i < n; ++i)
    BOOST_TEST(r.next_sync().value_or(-1) == i);
  BOOST_TEST(!r.next_sync());
  BOOST_TEST(p.written.load() == n);
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(stalled_reader_bounds_the_writer_in_bytes, *utf::timeout(60)) {
  probes p;
  current = &p;
  constexpr std::size_t pad = 16 * 1024;
  auto c = stream_cluster(2, [](rpc::agent_options& o) { o.stream_window_bytes = 4 * pad; });
  constexpr int n = 40;
  auto r = (*c)[0].open_stream<std::string>("w1", "padded", n, pad);
  auto stalled = p.stalled.get_future();
  BOOST_REQUIRE(stalled.wait_for(10s) == std::future_status::ready);
  const auto s = stalled.get();
  // Each item is its string and a few bytes of msgpack header: the window
  // fills after 4 items (the fourth passes it: one item over at most).
  BOOST_TEST(s.items_unacknowledged == 4u);
  BOOST_TEST(s.bytes_unacknowledged >= 4 * pad);
  BOOST_TEST(s.bytes_unacknowledged < 5 * pad);
  for (int i = 0; i < n; ++i)
    BOOST_TEST(r.next_sync().value_or("").size() == pad);
  BOOST_TEST(!r.next_sync());
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(lost_peer_fails_the_reader, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>(corodist::timeout::never(), "w1", "wait_forever");
  BOOST_TEST(r.next_sync().value_or(0) == 1);
  c->agents[1].reset(); // the callee's agent goes (an immediate shutdown closes its connections)
  try {
    r.next_sync();
    BOOST_FAIL("the stream went on without its peer");
  } catch (const corodist::peer_lost_error& e) {
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.rank() == 1);
  }
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0; }));
  // The callee's handler was cancelled when its agent went.
  auto f = p.aborted.get_future();
  BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(f.get() == std::error_code(asio::error::operation_aborted));
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(lost_client_cancels_the_handler, *utf::timeout(60)) {
  probes p;
  current = &p;
  auto c = stream_cluster(2);
  {
    auto r = (*c)[0].open_stream<int>(corodist::timeout::never(), "w1", "wait_forever");
    BOOST_TEST(r.next_sync().value_or(0) == 1);
    c->agents[0].reset(); // the caller's agent goes, its stream still open
  }
  auto f = p.aborted.get_future();
  BOOST_REQUIRE(f.wait_for(10s) == std::future_status::ready);
  BOOST_TEST(f.get() == std::error_code(asio::error::operation_aborted));
  BOOST_TEST(eventually([&] { return (*c)[1].open_streams() == 0; }));
  current = nullptr;
}

BOOST_AUTO_TEST_CASE(bidirectional_and_client_streams, *utf::timeout(60)) {
  auto c = stream_cluster(2, [](rpc::agent_options& o) { o.stream_window_items = 4; });
  auto& a = (*c)[0];
  const auto out = run_on(*c, 0, [&]() -> asio::awaitable<std::vector<std::string>> {
    auto s = a.open_bidi<std::string, std::string>("w1", "upper");
    std::vector<std::string> got;
    for (int i = 0; i < 100; ++i) {
      co_await s.write("item " + std::to_string(i));
      if (i % 3 == 2) { // interleaved: answers before all the questions (as many as were asked:
        for (int k = 0; k < 3; ++k) { // a side that stops reading holds the other's writes at its window)
          auto v = co_await s.next();
          got.push_back(v.value_or("?"));
        }
      }
    }
    s.close_write();
    while (auto v = co_await s.next())
      got.push_back(*v);
    co_return got;
  }());
  BOOST_REQUIRE(out.size() == 100u);
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(out[static_cast<std::size_t>(i)] == "ITEM " + std::to_string(i));
  const long total = run_on(*c, 0, [&]() -> asio::awaitable<long> {
    auto s = a.open_bidi<long, long>("w1", "sum", 1000L);
    for (long i = 1; i <= 1000; ++i)
      co_await s.write(i);
    s.close_write();
    auto v = co_await s.next();
    auto end = co_await s.next();
    co_return end ? -1 : v.value_or(-2);
  }());
  BOOST_TEST(total == 1000 + 1000 * 1001 / 2);
  BOOST_TEST(eventually([&] { return (*c)[0].open_streams() == 0 && (*c)[1].open_streams() == 0; }));
}

BOOST_AUTO_TEST_CASE(stream_calls_off_the_loop_are_refused, *utf::timeout(60)) {
  auto c = stream_cluster(2);
  auto r = (*c)[0].open_stream<int>("w1", "count", 3);
  // next() awaited on another loop than the agent's.
  event_loop other;
  other.start();
  BOOST_CHECK_THROW(corodist::run_blocking(other.get_executor(), r.next()), corodist::usage_error);
  BOOST_TEST(r.next_sync().value_or(-1) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
