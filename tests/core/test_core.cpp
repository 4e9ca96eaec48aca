#define BOOST_TEST_MODULE corodist_core
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/when_all.hpp>
#include <corodist/core/run_on.hpp>
#include <corodist/core/gate.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/core/logging.hpp>
#include <corodist/core/timeout.hpp>

#include "support/cancel.hpp"
#include "support/coro_test.hpp"
#if CORODIST_IO_URING
#include "core/deadline.hpp"
#include "core/ring_setup.hpp"
#include <liburing.h>
#endif
#include "support/loop_helpers.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <future>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
using corodist::event_loop;
using corodist::future;
using corodist::promise;
using corodist::test::on_loop;

namespace {

/// The scheduler state of thread `tid` of this process, from /proc: 'R'
/// running, 'S' asleep (waiting on an event), ...; '?' if unreadable.
char thread_state(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto p = line.rfind(')'); // after the command name, which may hold spaces
  return p != std::string::npos && p + 2 < line.size() ? line[p + 2] : '?';
}

} // namespace

BOOST_AUTO_TEST_SUITE(loop)

BOOST_AUTO_TEST_CASE(start_stop_restart, *utf::timeout(30)) {
  event_loop loop;
  BOOST_TEST(!loop.running());
  loop.start();
  loop.start(); // idempotent
  BOOST_TEST(loop.running());
  auto tid = on_loop(loop, [] { return std::this_thread::get_id(); });
  BOOST_TEST((tid != std::this_thread::get_id()));
  BOOST_TEST(on_loop(loop, [&] { return loop.running_in_this_thread(); }));
  BOOST_TEST(!loop.running_in_this_thread());
  BOOST_TEST(on_loop(loop, [] { return corodist::detail::on_loop_thread(); }));
  BOOST_TEST(!corodist::detail::on_loop_thread());
  loop.stop();
  loop.stop(); // idempotent
  BOOST_TEST(!loop.running());
  loop.start(); // restartable
  BOOST_TEST(on_loop(loop, [] { return 42; }) == 42);
}

BOOST_AUTO_TEST_CASE(backend_is_reported, *utf::timeout(10)) {
#if CORODIST_IO_URING
  BOOST_TEST(event_loop::backend() == "io_uring");
  BOOST_CHECK_NO_THROW(event_loop::probe_io_uring());
#else
  BOOST_TEST(event_loop::backend() == "epoll");
#endif
}

#if CORODIST_IO_URING
// An owned loop's ring takes COOP_TASKRUN | TASKRUN_FLAG where the kernel has them (5.19+);
// an io_context a user makes keeps Asio's own setup (flags 0).
BOOST_AUTO_TEST_CASE(owned_rings_are_cooperative_users_rings_untouched, *utf::timeout(30)) {
  const unsigned coop = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  BOOST_TEST(corodist::detail::owned_loop_ring_flags() == coop);
  io_uring probe;
  io_uring_params params{};
  params.flags = coop;
  const bool kernel_has_coop = io_uring_queue_init_params(4, &probe, &params) == 0;
  if (kernel_has_coop)
    io_uring_queue_exit(&probe);
  {
    event_loop loop;
    BOOST_TEST(corodist::detail::last_ring_flags() == (kernel_has_coop ? coop : 0u));
    loop.start();
    // Completions reach the cooperative ring: a timer and cross-thread posts.
    BOOST_TEST(on_loop(loop, [] { return 7; }) == 7);
    auto fired = on_loop(loop, [&loop] {
      auto t = std::make_shared<asio::steady_timer>(loop.get_executor(), 5ms);
      auto p = std::make_shared<std::promise<void>>();
      auto f = p->get_future();
      t->async_wait([t, p](std::error_code) { p->set_value(); });
      return f;
    });
    BOOST_TEST((fired.wait_for(10s) == std::future_status::ready));
  }
  asio::io_context users;
  asio::steady_timer makes_users_ring(users); // Asio makes a ring with the first I/O object
  BOOST_TEST(corodist::detail::last_ring_flags() == 0u);
}
#endif

BOOST_AUTO_TEST_CASE(embedded_mode_runs_on_users_context, *utf::timeout(30)) {
  asio::io_context ctx;
  event_loop loop(ctx);
  BOOST_CHECK_THROW(loop.start(), corodist::usage_error);
  BOOST_TEST(&loop.context() == &ctx);
  bool ran = false, on_loop_flag = false;
  asio::post(loop.get_executor(), [&] {
    ran = true;
    on_loop_flag = loop.running_in_this_thread() && corodist::detail::on_loop_thread();
  });
  BOOST_TEST(!ran);
  ctx.run();
  BOOST_TEST(ran);
  BOOST_TEST(on_loop_flag);
  loop.stop(); // no-op in embedded mode
}

BOOST_AUTO_TEST_CASE(destroying_a_started_loop_joins, *utf::timeout(30)) {
  std::atomic<int> n{0};
  {
    event_loop loop;
    loop.start();
    for (int i = 0; i < 100; ++i)
      asio::post(loop.get_executor(), [&] { ++n; });
    on_loop(loop, [] {});
  }
  BOOST_TEST(n.load() == 100);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(futures)

BOOST_AUTO_TEST_CASE(value_across_threads, *utf::timeout(30)) {
  promise<int> p;
  auto f = p.get_future();
  BOOST_TEST(f.valid());
  BOOST_TEST(!f.is_ready());
  BOOST_TEST(!f.wait_for(10ms));
  // The value is set once this thread sleeps in get(): the wake-up across
  // threads is what is tested.
  const pid_t getter = ::gettid();
  std::promise<void> getting;
  bool set_while_asleep = false;
  std::thread t([&, getting_f = getting.get_future()] {
    getting_f.wait_for(10s);
    set_while_asleep = corodist::test::eventually([&] { return thread_state(getter) == 'S'; });
    p.set_value(7);
  });
  getting.set_value();
  BOOST_TEST(f.get() == 7);
  t.join();
  BOOST_TEST(set_while_asleep);
  BOOST_CHECK_THROW(p.set_value(8), corodist::usage_error);
  BOOST_CHECK_THROW(f.get(), corodist::usage_error); // value already taken
}

BOOST_AUTO_TEST_CASE(exception_across_threads, *utf::timeout(30)) {
  promise<std::string> p;
  auto f = p.get_future();
  std::thread t([&] { p.set_exception(std::make_exception_ptr(corodist::timeout_error("too slow"))); });
  t.join();
  BOOST_CHECK_EXCEPTION(f.get(), corodist::timeout_error,
                        [](const auto& e) { return std::string(e.what()) == "too slow"; });
}

BOOST_AUTO_TEST_CASE(broken_promise, *utf::timeout(10)) {
  future<int> f;
  BOOST_TEST(!f.valid());
  BOOST_CHECK_THROW(f.get(), corodist::usage_error);
  {
    promise<int> p;
    f = p.get_future();
    BOOST_CHECK_THROW(p.get_future(), corodist::usage_error);
  }
  BOOST_CHECK_THROW(f.get(), corodist::error);
}

BOOST_AUTO_TEST_CASE(then_chains_and_carries_exceptions, *utf::timeout(30)) {
  promise<int> p;
  auto f = p.get_future().then([](int v) { return v * 2; }).then([](int v) { return std::to_string(v); });
  std::thread t([&] { p.set_value(21); });
  BOOST_TEST(f.get() == "42");
  t.join();

  promise<int> q;
  bool called = false;
  auto g = q.get_future().then([&](int) {
    called = true;
    return 1;
  });
  q.set_exception(std::make_exception_ptr(std::runtime_error("boom")));
  BOOST_CHECK_THROW(g.get(), std::runtime_error);
  BOOST_TEST(!called);

  // A continuation that throws stores its exception; one on a ready future runs at once.
  auto h = corodist::make_ready_future(5).then([](int) -> int { throw corodist::protocol_error("bad"); });
  BOOST_CHECK_THROW(h.get(), corodist::protocol_error);

  promise<void> v;
  std::atomic<bool> ran{false};
  auto vf = v.get_future().then([&] { ran = true; });
  v.set_value();
  vf.get();
  BOOST_TEST(ran.load());
}

BOOST_AUTO_TEST_CASE(co_await_resumes_on_awaiting_executor, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  promise<int> p;
  auto f = p.get_future();
  std::promise<std::pair<int, bool>> done;
  std::promise<void> awaiting;
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<void> {
        awaiting.set_value();
        int v = co_await f.async_get();
        done.set_value({v, loop.running_in_this_thread()});
      },
      asio::detached);
  // The value is set once the coroutine is suspended in async_get(): it
  // signals just before, and a handler posted after that runs after the
  // suspension (the loop has one thread).
  std::thread setter([&, awaiting_f = awaiting.get_future()] {
    awaiting_f.wait_for(5s);
    std::promise<void> turned;
    asio::post(loop.get_executor(), [&] { turned.set_value(); });
    turned.get_future().wait_for(5s);
    p.set_value(99);
  });
  auto r = done.get_future();
  BOOST_REQUIRE(r.wait_for(5s) == std::future_status::ready);
  auto [v, on_loop_thread] = r.get();
  BOOST_TEST(v == 99);
  BOOST_TEST(on_loop_thread);
  setter.join();
}

BOOST_AUTO_TEST_CASE(co_await_on_a_strand_of_a_thread_pool, *utf::timeout(30)) {
  asio::thread_pool pool(2);
  auto strand = asio::make_strand(pool);
  promise<std::string> p;
  auto f = p.get_future();
  std::promise<bool> done;
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        try {
          (void)co_await f.async_get();
          done.set_value(false);
        } catch (const corodist::remote_error& e) {
          done.set_value(e.worker() == "w1" && strand.running_in_this_thread());
        }
      },
      asio::detached);
  p.set_exception(std::make_exception_ptr(corodist::remote_error("w1", "std::runtime_error", "bad")));
  auto r = done.get_future();
  BOOST_REQUIRE(r.wait_for(5s) == std::future_status::ready);
  BOOST_TEST(r.get());
  pool.join();
}

BOOST_AUTO_TEST_CASE(co_await_void_and_ready_futures, *utf::timeout(30)) {
  asio::io_context ctx;
  auto r = corodist::test::run_coro(ctx, []() -> asio::awaitable<int> {
    co_await corodist::make_ready_future().async_get();
    int a = co_await corodist::make_ready_future(40).async_get();
    promise<int> p;
    auto f = p.get_future();
    p.set_value(2);
    co_return a + co_await f.async_get();
  }());
  BOOST_TEST(r == 42);
}

BOOST_AUTO_TEST_CASE(blocking_get_on_loop_thread_throws, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  promise<int> p;
  auto f = p.get_future();
  auto what = on_loop(loop, [&]() -> std::string {
    try {
      f.get();
      return "no exception";
    } catch (const corodist::usage_error& e) {
      return e.what();
    }
  });
  BOOST_TEST(what.find("deadlock") != std::string::npos);
  auto wait_for_throws = on_loop(loop, [&] {
    try {
      f.wait_for(1ms);
      return false;
    } catch (const corodist::usage_error&) {
      return true;
    }
  });
  BOOST_TEST(wait_for_throws);
  // Once ready, get() on the loop does not block and is allowed.
  p.set_value(3);
  BOOST_TEST(on_loop(loop, [&] { return f.get(); }) == 3);
}

BOOST_AUTO_TEST_CASE(await_is_cancellable_with_a_timer, *utf::timeout(30)) {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context ctx;
  promise<int> p; // never set
  auto f = p.get_future();
  auto start = std::chrono::steady_clock::now();
  auto idx = corodist::test::run_coro(ctx, [&]() -> asio::awaitable<std::size_t> {
    asio::steady_timer t(co_await asio::this_coro::executor, 30ms);
    auto r = co_await (f.async_get() || t.async_wait(asio::use_awaitable));
    co_return r.index();
  }());
  BOOST_TEST(idx == 1u);
  BOOST_CHECK(std::chrono::steady_clock::now() - start < 2s);
  // The promise can still be fulfilled after the waiter gave up, and the
  // result is still there for the next consumer.
  BOOST_CHECK_NO_THROW(p.set_value(1));
  BOOST_TEST(f.get() == 1);
}

BOOST_AUTO_TEST_CASE(async_wait_with_a_callback, *utf::timeout(30)) {
  asio::io_context ctx;
  promise<int> p;
  auto f = p.get_future();
  std::error_code got = asio::error::would_block;
  f.async_wait(asio::bind_executor(ctx, [&](std::error_code ec) { got = ec; }));
  std::thread t([&] { p.set_value(5); });
  ctx.run_for(5s); // the pending wait keeps run() going until the handler ran
  t.join();
  BOOST_TEST(!got);
  BOOST_TEST(f.get() == 5);
}

BOOST_AUTO_TEST_CASE(many_threads_many_futures, *utf::timeout(60)) {
  constexpr int n = 2000;
  event_loop loop;
  loop.start();
  std::vector<promise<int>> ps(n);
  std::vector<future<int>> fs;
  for (auto& p : ps)
    fs.push_back(p.get_future());
  std::atomic<long> sum{0};
  std::promise<void> all;
  std::atomic<int> left{n};
  for (int i = 0; i < n; ++i)
    asio::co_spawn(
        loop.get_executor(),
        [&, i]() -> asio::awaitable<void> {
          sum += co_await fs[i].async_get();
          if (--left == 0)
            all.set_value();
        },
        asio::detached);
  std::thread a([&] {
    for (int i = 0; i < n; i += 2)
      ps[i].set_value(i);
  });
  std::thread b([&] {
    for (int i = 1; i < n; i += 2)
      ps[i].set_value(i);
  });
  a.join();
  b.join();
  BOOST_REQUIRE(all.get_future().wait_for(10s) == std::future_status::ready);
  BOOST_TEST(sum.load() == long(n) * (n - 1) / 2);
}

// A blocking facade on a loop that is not running would wait forever: it
// refuses at once, saying so; once started, the same call works.
BOOST_AUTO_TEST_CASE(blocking_on_a_loop_that_is_not_running_refuses, *utf::timeout(30)) {
  event_loop loop;
  auto op = []() -> asio::awaitable<int> { co_return 1; };
  try {
    corodist::run_blocking(loop.get_executor(), op(), "test call");
    BOOST_FAIL("run_blocking waited on a loop that was never started");
  } catch (const corodist::usage_error& e) {
    BOOST_TEST(std::string(e.what()).find("not running") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("test call") != std::string::npos, e.what());
  }
  loop.start();
  BOOST_TEST(corodist::run_blocking(loop.get_executor(), op(), "test call") == 1);
  loop.stop();
  BOOST_CHECK_THROW(corodist::run_blocking(loop.get_executor(), op(), "test call"), corodist::usage_error);
}

// The private "operation or deadline" race: a result, a deadline, and an
// exception rethrown at once (Asio 1.22's || alone would wait for the timer
// and drop it).
BOOST_AUTO_TEST_CASE(within_returns_times_out_and_rethrows, *utf::timeout(30)) {
  asio::io_context ctx;
  auto quick = []() -> asio::awaitable<int> { co_return 7; };
  auto slow = []() -> asio::awaitable<int> {
    asio::steady_timer t(co_await asio::this_coro::executor, 10s);
    co_await t.async_wait(asio::use_awaitable);
    co_return 1;
  };
  auto thrower = []() -> asio::awaitable<int> {
    throw corodist::protocol_error("thrown");
    co_return 0;
  };
  BOOST_TEST(*corodist::test::run_coro(ctx, corodist::detail::within<int>(quick(), 5s)) == 7);
  BOOST_TEST(!corodist::test::run_coro(ctx, corodist::detail::within<int>(slow(), 20ms)).has_value());
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_CHECK_THROW(corodist::test::run_coro(ctx, corodist::detail::within<int>(thrower(), 10s)),
                    corodist::protocol_error);
  BOOST_CHECK(std::chrono::steady_clock::now() - t0 < 5s); // at once, not at the deadline
}

BOOST_AUTO_TEST_CASE(shared_future_many_consumers, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  promise<std::string> p;
  corodist::shared_future<std::string> sf = p.get_future().share();
  auto copy = sf;
  constexpr int n = 50;
  std::atomic<int> seen{0};
  std::promise<void> all;
  for (int i = 0; i < n; ++i)
    asio::co_spawn(
        loop.get_executor(),
        [&, sf]() -> asio::awaitable<void> {
          if (co_await sf.async_get() == "v")
            if (++seen == n)
              all.set_value();
        },
        asio::detached);
  std::thread waiter([&] { BOOST_TEST(copy.get() == "v"); });
  p.set_value("v");
  BOOST_REQUIRE(all.get_future().wait_for(5s) == std::future_status::ready);
  waiter.join();
  BOOST_TEST(sf.get() == "v"); // read, not taken
  promise<void> q;
  auto failed = q.get_future().share();
  q.set_exception(std::make_exception_ptr(corodist::protocol_error("gone")));
  BOOST_CHECK_THROW(failed.get(), corodist::protocol_error);
  BOOST_CHECK_THROW(failed.get(), corodist::protocol_error);
}

BOOST_AUTO_TEST_CASE(when_all_values_and_first_error, *utf::timeout(30)) {
  std::vector<promise<int>> ps(3);
  std::vector<future<int>> fs;
  for (auto& p : ps)
    fs.push_back(p.get_future());
  auto all = corodist::when_all(std::move(fs));
  ps[2].set_value(3);
  ps[0].set_value(1);
  BOOST_TEST(!all.is_ready());
  std::thread t([&] { ps[1].set_value(2); });
  BOOST_TEST((all.get() == std::vector<int>{1, 2, 3}));
  t.join();

  std::vector<promise<void>> vs(3);
  std::vector<future<void>> vfs;
  for (auto& p : vs)
    vfs.push_back(p.get_future());
  auto done = corodist::when_all(std::move(vfs));
  vs[1].set_exception(std::make_exception_ptr(corodist::timeout_error("second")));
  vs[0].set_exception(std::make_exception_ptr(corodist::protocol_error("first")));
  BOOST_TEST(!done.is_ready()); // waits for every one
  vs[2].set_value();
  BOOST_CHECK_THROW(done.get(), corodist::protocol_error);
  BOOST_TEST(corodist::when_all(std::vector<future<int>>{}).get().empty());
}

BOOST_AUTO_TEST_CASE(gate_counts_and_drains, *utf::timeout(30)) {
  corodist::gate g("test gate");
  auto a = g.enter();
  auto b = g.enter();
  BOOST_TEST(g.count() == 2u);
  auto idle = g.wait_idle();
  a.release();
  BOOST_TEST(!idle.is_ready());
  auto closing = g.close();
  BOOST_CHECK_THROW(g.enter(), corodist::usage_error);
  BOOST_TEST(!g.try_enter());
  std::thread t([&] { b.release(); });
  closing.get();
  t.join();
  BOOST_TEST(idle.is_ready());
  BOOST_TEST(g.count() == 0u);
  BOOST_TEST(g.close().is_ready()); // idempotent, and idle at once
}

BOOST_AUTO_TEST_CASE(run_on_inline_or_posted, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  asio::thread_pool pool(1);
  // From a plain thread: posted to the loop.
  auto on_loop_f = corodist::run_on(loop.get_executor(), [&] { return loop.running_in_this_thread(); });
  BOOST_TEST(on_loop_f.get());
  // From the loop: inline (ready before run_on returns).
  BOOST_TEST(on_loop(loop, [&] {
    return corodist::run_on(loop.get_executor(), [] { return 7; }).is_ready();
  }));
  // A coroutine on the loop offloads to the pool and resumes on the loop.
  std::promise<std::pair<int, bool>> done;
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<void> {
        int v = co_await corodist::run_on(pool.get_executor(), [] { return 41 + 1; }).async_get();
        done.set_value({v, loop.running_in_this_thread()});
      },
      asio::detached);
  auto r = done.get_future();
  BOOST_REQUIRE(r.wait_for(5s) == std::future_status::ready);
  BOOST_TEST(r.get().first == 42);
  auto thrown = corodist::run_on(pool.get_executor(), []() -> int { throw corodist::protocol_error("x"); });
  BOOST_CHECK_THROW(thrown.get(), corodist::protocol_error);
  pool.join();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(time_limits)

// The vocabulary of every API's time limit: a length, none, or inherited; a
// zero length is a deadline already passed (not "none").
BOOST_AUTO_TEST_CASE(timeout_says_after_never_or_inherit, *utf::timeout(10)) {
  using corodist::timeout;
  const timeout t = 1500ms;
  BOOST_TEST(t.is_finite());
  BOOST_TEST(t.length().count() == 1500);
  BOOST_TEST(t.str() == "1500 ms");
  BOOST_TEST(timeout(std::chrono::microseconds(1)).length().count() == 1); // rounded up, never to zero
  BOOST_TEST(timeout(-5s).length().count() == 0);                          // negative: zero
  BOOST_TEST(timeout::never().is_never());
  BOOST_TEST(timeout::never().str() == "no time limit");
  BOOST_TEST(timeout().is_inherit());
  BOOST_TEST(timeout::inherit().or_else(2s) == timeout(2s));
  BOOST_TEST(timeout(3s).or_else(2s) == timeout(3s));
  BOOST_TEST(timeout::never().or_else(2s) == timeout::never());
  BOOST_TEST(!(timeout(0ms) == timeout::never())); // zero is not "none"
}

BOOST_AUTO_TEST_CASE(deadline_is_made_once_and_counts_down, *utf::timeout(10)) {
  using corodist::deadline;
  using corodist::timeout;
  const auto now = std::chrono::steady_clock::now();
  const deadline d = timeout(2s).from(now);
  BOOST_TEST(!d.is_never());
  BOOST_TEST(!d.expired(now));
  BOOST_TEST(d.expired(now + 2s));
  BOOST_TEST((d.remaining(now + 500ms) == 1500ms));
  BOOST_TEST((d.remaining(now + 3s) == std::chrono::steady_clock::duration::zero()));
  BOOST_TEST(d.left(now + 500ms) == timeout(1500ms));
  BOOST_TEST(timeout(0ms).from(now).expired(now)); // zero: passed already
  const deadline never = timeout::never().from(now);
  BOOST_TEST(never.is_never());
  BOOST_TEST(!never.expired(std::chrono::steady_clock::time_point::max() - 1s));
  BOOST_TEST(never.left() == timeout::never());
  BOOST_TEST((earliest(d, never) == d));
  BOOST_TEST(timeout::inherit().from(now).is_never()); // resolved with or_else before use
  // Saturates instead of overflowing.
  BOOST_TEST(deadline::after(std::chrono::steady_clock::duration::max(), now).is_never());
}

// The wire form: the time remaining in whole milliseconds, rounded up so that
// a live deadline never reads as "none" (0).
BOOST_AUTO_TEST_CASE(deadline_wire_form_round_trips, *utf::timeout(10)) {
  using corodist::deadline;
  const auto now = std::chrono::steady_clock::now();
  BOOST_TEST(deadline::never().to_wire(now) == 0u);
  BOOST_TEST(deadline::after(1500us, now).to_wire(now) == 2u);
  BOOST_TEST(deadline::after(0ms, now).to_wire(now) == 1u); // passed: still a deadline
  BOOST_TEST(deadline::from_wire(0, now).is_never());
  BOOST_TEST((deadline::from_wire(250, now).at() == now + 250ms));
  BOOST_TEST(deadline::from_wire(std::uint64_t{1} << 62, now).is_never()); // past a year: none
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(logging)

BOOST_AUTO_TEST_CASE(levels, *utf::timeout(10)) {
  auto old = std::string(corodist::log_level());
  corodist::set_log_level("debug");
  BOOST_TEST(corodist::log_level() == "debug");
  BOOST_CHECK_THROW(corodist::set_log_level("loud"), std::invalid_argument);
  corodist::set_log_level("TRACE"); // level names in any case
  BOOST_TEST(corodist::log_level() == "trace");
  corodist::set_log_level("Warn");
  BOOST_TEST(corodist::log_level() == "warning");
  BOOST_CHECK_THROW(corodist::set_log_level("OFFF"), std::invalid_argument);
  corodist::set_log_level(old);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cancellation)

// Each cancellation type ends a shared_future wait bound to the slot with
// operation_aborted; the other waiter and the shared result are untouched.
BOOST_AUTO_TEST_CASE(every_cancellation_type_ends_only_its_own_wait, *utf::timeout(30)) {
  for (auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                    asio::cancellation_type::total}) {
    asio::io_context ctx;
    promise<int> p;
    auto shared = p.get_future().share();
    asio::cancellation_signal cancel;
    std::exception_ptr cancelled_error;
    bool cancelled_done = false, other_done = false;
    int other_value = 0;
    shared.async_get(asio::bind_cancellation_slot(cancel.slot(), asio::bind_executor(ctx, [&](std::exception_ptr e, int) {
                                                    cancelled_error = e;
                                                    cancelled_done = true;
                                                  })));
    shared.async_get(asio::bind_executor(ctx, [&](std::exception_ptr e, int v) {
      BOOST_TEST(!e);
      other_value = v;
      other_done = true;
    }));
    cancel.emit(type);
    while (!cancelled_done) // the cancelled wait's completion is posted at once
      ctx.run_one();
    corodist::test::check_operation_aborted(cancelled_error);
    BOOST_TEST(!other_done);
    p.set_value(9);
    while (!other_done)
      ctx.run_one();
    BOOST_TEST(other_value == 9);
    BOOST_TEST(shared.get() == 9);
  }
}

// A wait on a future cancelled through the awaiting coroutine (terminal)
// ends with operation_aborted; the result then set stays for the next taker.
BOOST_AUTO_TEST_CASE(a_cancelled_coroutine_wait_leaves_the_result, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  promise<int> p;
  auto f = p.get_future();
  asio::cancellation_signal cancel;
  std::future<std::exception_ptr> ended;
  on_loop(loop, [&] {
    ended = corodist::test::spawn_cancellable(loop.get_executor(), f.async_get(), cancel);
    // Posted behind the coroutine's start: it is waiting by then.
    asio::post(loop.get_executor(), [&] { cancel.emit(asio::cancellation_type::terminal); });
  });
  corodist::test::require_cancelled(ended);
  p.set_value(4);
  BOOST_TEST(f.get() == 4);
}

// The private operation-or-deadline race, cancelled from outside while its
// operation runs, ends with operation_aborted (never as its deadline).
BOOST_AUTO_TEST_CASE(a_race_cancelled_from_outside_ends_with_operation_aborted, *utf::timeout(30)) {
  asio::io_context ctx;
  asio::cancellation_signal cancel;
  std::exception_ptr failure;
  bool done = false, reported = false;
  auto op = [&]() -> asio::awaitable<int> {
    asio::steady_timer t(co_await asio::this_coro::executor, 1h);
    asio::post(ctx, [&] { cancel.emit(asio::cancellation_type::terminal); }); // it is running now
    co_await t.async_wait(asio::use_awaitable);
    co_return 1;
  };
  asio::co_spawn(ctx,
                 [&]() -> asio::awaitable<void> {
                   auto r = co_await corodist::detail::within(op(), std::chrono::steady_clock::duration(1h));
                   reported = true; // neither a result nor a deadline may come back
                   (void)r;
                 },
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
                   failure = e;
                   done = true;
                 }));
  ctx.run_for(10s);
  BOOST_REQUIRE(done);
  BOOST_TEST(!reported);
  corodist::test::check_operation_aborted(failure);
}

BOOST_AUTO_TEST_SUITE_END()
