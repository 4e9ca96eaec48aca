// corodist::worker_thread: blocking jobs off the loop, results back as futures.
// Linked into test_core (BOOST_TEST_MODULE is in test_core.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/worker_thread.hpp>
#include <corodist/core/run_blocking.hpp>

#include "support/loop_helpers.hpp"

#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;

BOOST_AUTO_TEST_SUITE(worker_thread)

// A coroutine awaits a blocking job and resumes on its own loop, not on the worker.
BOOST_AUTO_TEST_CASE(coroutine_awaits_job_and_resumes_on_its_loop, *utf::timeout(20)) {
  corodist::event_loop loop;
  loop.start();
  corodist::worker_thread worker;
  auto [job_thread, resumed_on_loop, value] = corodist::run_blocking(
      loop.get_executor(), [&]() -> asio::awaitable<std::tuple<std::thread::id, bool, int>> {
        std::thread::id where;
        std::promise<void> suspended;
        auto f = worker.submit([&, gate = suspended.get_future()] {
          where = std::this_thread::get_id();
          gate.wait_for(5s); // a blocking call, which returns once the coroutine awaits the job
          return 42;
        });
        // Runs once this coroutine is suspended in async_get() (the loop has one thread).
        asio::post(loop.get_executor(), [&] { suspended.set_value(); });
        int v = co_await f.async_get();
        co_return std::tuple{where, loop.running_in_this_thread(), v};
      }());
  BOOST_TEST(value == 42);
  BOOST_TEST(resumed_on_loop);
  BOOST_TEST((job_thread != std::this_thread::get_id()));
}

BOOST_AUTO_TEST_CASE(jobs_run_in_order_and_errors_travel, *utf::timeout(20)) {
  corodist::worker_thread worker;
  std::vector<int> order;
  std::vector<corodist::future<void>> done;
  for (int i = 0; i < 100; ++i)
    done.push_back(worker.submit([&order, i] { order.push_back(i); }));
  for (auto& f : done)
    f.get();
  BOOST_TEST(order.size() == 100u);
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(order[static_cast<std::size_t>(i)] == i);
  auto bad = worker.submit([]() -> int { throw std::runtime_error("boom"); });
  BOOST_CHECK_EXCEPTION(bad.get(), std::runtime_error, [](const auto& e) { return std::string(e.what()) == "boom"; });
  // The worker is not a loop thread: blocking facades work inside jobs.
  BOOST_TEST(!worker.submit([] { return corodist::detail::on_loop_thread(); }).get());
  BOOST_TEST(worker.submit([&] { return worker.running_in_this_thread(); }).get());
  BOOST_TEST(!worker.running_in_this_thread());
}

// Several threads overlap jobs; the spin option takes a job posted right
// after the last one without sleeping in between (the results are the same).
BOOST_AUTO_TEST_CASE(several_threads_and_spinning, *utf::timeout(20)) {
  corodist::worker_thread_options o;
  o.threads = 3;
  o.spin = 200us;
  corodist::worker_thread worker(o);
  std::atomic<int> inside{0}, most{0};
  std::promise<void> release, all_inside;
  auto gate = release.get_future().share();
  std::vector<corodist::future<void>> fs;
  for (int i = 0; i < 3; ++i)
    fs.push_back(worker.submit([&, gate] {
      int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      if (now == 3)
        all_inside.set_value();
      gate.wait_for(5s);
      --inside;
    }));
  // All three block at once only if they run on three threads.
  BOOST_TEST((all_inside.get_future().wait_for(10s) == std::future_status::ready));
  BOOST_TEST(most.load() == 3);
  release.set_value();
  for (auto& f : fs)
    f.get();
  int sum = 0;
  for (int i = 0; i < 1000; ++i)
    sum += worker.submit([i] { return i; }).get();
  BOOST_TEST(sum == 999 * 1000 / 2);
}

// stop() finishes queued jobs; later posts are refused with usage_error.
BOOST_AUTO_TEST_CASE(stop_drains_then_refuses, *utf::timeout(20)) {
  corodist::worker_thread worker;
  std::atomic<int> ran{0};
  // The first job holds the thread until stop() has begun (it refuses new
  // posts), so that stop() meets the other 49 still queued.
  std::promise<void> stopping;
  worker.post([&, gate = stopping.get_future()] {
    gate.wait_for(10s);
    ++ran;
  });
  for (int i = 1; i < 50; ++i)
    worker.post([&] { ++ran; });
  std::thread opener([&] {
    corodist::test::eventually([&] {
      try {
        worker.post([] {});
        return false;
      } catch (const corodist::usage_error&) {
        return true;
      }
    });
    stopping.set_value();
  });
  worker.stop();
  opener.join();
  BOOST_TEST(ran.load() == 50);
  BOOST_CHECK_THROW(worker.post([] {}), corodist::usage_error);
  BOOST_CHECK_THROW(corodist::worker_thread(corodist::worker_thread_options{.threads = 0}), corodist::usage_error);
}

BOOST_AUTO_TEST_SUITE_END()
