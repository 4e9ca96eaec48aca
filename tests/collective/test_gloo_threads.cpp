// The Gloo backend with ranks as threads of this process over one in-memory
// store: every collective, collectives in flight from coroutines, timeouts,
// mismatched calls, a late rank, abort, store keys, round robin, URL creation.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/round_robin_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/sync_store.hpp>

#include "collective/collective_checks.hpp"
#include "collective/gloo_fixtures.hpp"
#include "support/cancel.hpp"
#include "support/temp_file.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/detached.hpp>

#include <atomic>
#include <cstdio>
#include <future>
#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
using corodist::test::gloo_test_options;
using corodist::test::require_all_ok;
using corodist::test::require_throws;
using corodist::test::thread_ranks;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Waits until `key` holds `want` (events of the store, no polling); throws after `timeout`.
void wait_for_value(corodist::store::sync_store& s, const std::string& key, const std::string& want,
                    std::chrono::milliseconds timeout) {
  const auto deadline = clock_type::now() + timeout;
  auto changes = s.watch_key(key);
  std::vector<std::string> keys{key};
  if (s.check(keys) && s.get(key) == want)
    return;
  while (s.next(changes, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now())).value !=
         want) {
  }
}


} // namespace

BOOST_AUTO_TEST_SUITE(gloo_threads, *utf::precondition(corodist::test::gloo_built))

BOOST_AUTO_TEST_CASE(every_collective_on_three_thread_ranks, *utf::timeout(120)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto pg = job.group(r, 3);
    auto f = corodist::test::check_every_collective(*pg);
    if (!f.ok())
      throw std::runtime_error(f.text());
  }));
}

// With every allreduce on the ring, a floating avg divides in the ring's last
// addition on the rank that completes each chunk: every element must come
// out divided exactly once, whatever the rank count and however the buffer
// splits into chunks and segments (fewer elements than ranks, uneven chunks,
// several 1 MiB segments per chunk).
BOOST_AUTO_TEST_CASE(ring_average_divides_each_element_once, *utf::timeout(120)) {
  for (int n : {2, 3, 4}) {
    thread_ranks job;
    require_all_ok(job.run(n, [&](int r) {
      auto opts = gloo_test_options();
      opts.bcube_max_bytes = 0;
      auto pg = job.group(r, n, opts);
      corodist::test::failures f;
      for (auto t : {cc::dtype::float32, cc::dtype::float64, cc::dtype::float16, cc::dtype::bfloat16})
        for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{1009}, std::size_t{1'300'003}})
          if (cc::element_size(t) == 4 || count < 100'000)
            corodist::test::check_allreduce(*pg, f, t, cc::reduce_op::avg, count);
      if (!f.ok())
        throw std::runtime_error("ranks " + std::to_string(n) + ": " + f.text());
    }));
  }
}

// Coalesced calls split into many staging buckets; two communication threads.
BOOST_AUTO_TEST_CASE(small_buckets_and_two_threads, *utf::timeout(120)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto opts = gloo_test_options();
    opts.bucket_bytes = 256;
    opts.threads = 2;
    opts.check_calls = true; // headers posted per collective (no pre-posting with two threads)
    auto pg = job.group(r, 2, opts);
    auto f = corodist::test::check_every_collective(*pg);
    if (!f.ok())
      throw std::runtime_error(f.text());
  }));
}

// Several coroutines on each rank's loop, each issuing many allreduces
// before awaiting any: they are in flight together, issued in the same order
// on every rank (coroutines start in spawn order and issue before they first
// suspend), and all complete with the right sums.
BOOST_AUTO_TEST_CASE(many_collectives_in_flight_from_coroutines, *utf::timeout(120)) {
  thread_ranks job;
  constexpr int ranks = 3, coroutines = 6, per_coroutine = 20;
  require_all_ok(job.run(ranks, [&](int r) {
    auto opts = gloo_test_options();
    opts.threads = r == 0 ? 2 : 1; // one rank overlaps collectives, the others pre-post headers
    opts.check_calls = true;
    auto pg = job.group(r, ranks, opts);
    corodist::event_loop loop;
    loop.start();
    std::atomic<int> wrong{0};
    auto ex = loop.get_executor();
    corodist::run_blocking(ex, [&]() -> asio::awaitable<void> {
      corodist::promise<void> all_done;
      auto done = all_done.get_future();
      int left = coroutines;
      auto body = [&](int c) -> asio::awaitable<void> {
        std::vector<std::vector<std::int64_t>> bufs;
        std::vector<cc::work> works;
        for (int j = 0; j < per_coroutine; ++j) {
          const std::size_t n = 1 + static_cast<std::size_t>((c * per_coroutine + j) * 397 % 5000);
          bufs.emplace_back(n, static_cast<std::int64_t>(r + 1) * (c * 100 + j));
        }
        for (auto& b : bufs)
          works.push_back(pg->allreduce(b));
        for (int j = 0; j < per_coroutine; ++j) {
          co_await std::move(works[static_cast<std::size_t>(j)]);
          const std::int64_t want = static_cast<std::int64_t>(ranks * (ranks + 1) / 2) * (c * 100 + j);
          for (auto v : bufs[static_cast<std::size_t>(j)])
            if (v != want)
              ++wrong;
        }
        if (--left == 0)
          all_done.set_value();
      };
      for (int c = 0; c < coroutines; ++c)
        asio::co_spawn(ex, body(c), asio::detached);
      co_await done.async_get();
    }());
    RANK_REQUIRE(wrong.load() == 0);
    RANK_REQUIRE(pg->sequence_number() == static_cast<std::uint64_t>(coroutines * per_coroutine));
  }));
}

// With two communication threads a barrier could overtake a big allreduce
// issued before it; it completes only after it (as PyTorch's barrier).
BOOST_AUTO_TEST_CASE(barrier_completes_after_earlier_collectives, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    RANK_REQUIRE(pg->backend() == "gloo");
    for (int i = 0; i < 3; ++i) {
      std::vector<float> big(std::size_t{4} << 20, 1.0f);
      auto w = pg->allreduce(big);
      pg->barrier().get();
      RANK_REQUIRE(w.is_completed());
      w.get();
      RANK_REQUIRE(big.back() == 2.0f);
    }
  }));
}

// Rank 2 never enters allreduce #1: ranks 0 and 1 fail within the deadline,
// naming the collective and its sequence number, and the group is aborted;
// rank 2's next collective then fails at once (its peers ended the connections).
BOOST_AUTO_TEST_CASE(timeout_when_a_rank_never_joins, *utf::timeout(60)) {
  thread_ranks job;
  corodist::test::countdown failed(2);
  std::atomic<int> timeouts{0};
  require_all_ok(job.run(3, [&](int r) {
    auto pg = job.group(r, 3);
    std::vector<float> v(100, 1.0f);
    pg->allreduce(v).get(); // #0: everyone
    if (r == 2) {
      RANK_REQUIRE(failed.wait_for(20s));
      const auto t0 = clock_type::now();
      auto msg = require_throws<cc::collective_error>([&] { pg->allreduce(v, cc::reduce_op::sum, {.timeout = 5s}).get(); },
                                                      "rank 2's late allreduce");
      RANK_REQUIRE(seconds_since(t0) < 3.0);
      RANK_REQUIRE(msg.find("allreduce #1 on rank 2 of 3") != std::string::npos);
      return;
    }
    const auto t0 = clock_type::now();
    std::string msg;
    try {
      pg->allreduce(v, cc::reduce_op::sum, {.timeout = 500ms}).get();
    } catch (const cc::collective_timeout_error& e) {
      ++timeouts;
      RANK_REQUIRE(e.op() == "allreduce" && e.seq() == 1u && e.rank() == r);
      msg = e.what();
    } catch (const cc::collective_error& e) { // the other rank timed out first and ended its connections
      RANK_REQUIRE(e.op() == "allreduce" && e.seq() == 1u);
      msg = e.what();
    }
    const double took = seconds_since(t0);
    failed.arrive();
    RANK_REQUIRE(!msg.empty());
    RANK_REQUIRE(msg.find("allreduce #1") != std::string::npos);
    RANK_REQUIRE(took >= 0.45 && took < 3.0);
    RANK_REQUIRE(pg->aborted());
    // Later collectives fail at once.
    const auto t1 = clock_type::now();
    auto later = require_throws<cc::collective_error>([&] { pg->barrier().get(); }, "barrier after the abort");
    RANK_REQUIRE(seconds_since(t1) < 1.0);
    RANK_REQUIRE(later.find("barrier #2") != std::string::npos);
    RANK_REQUIRE(later.find("aborted") != std::string::npos);
  }));
  BOOST_TEST(timeouts.load() >= 1);
}

// Two ranks of three create their group; the third never arrives.
BOOST_AUTO_TEST_CASE(creation_names_the_rank_that_never_arrived, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    const auto t0 = clock_type::now();
    auto msg = require_throws<corodist::timeout_error>([&] { job.group(r, 3, gloo_test_options("lonely", 700ms)); },
                                                       "create without rank 2");
    RANK_REQUIRE(seconds_since(t0) < 5.0);
    RANK_REQUIRE(msg.find("missing ranks: 2") != std::string::npos);
  }));
}

// With the call check on, different sizes, dtypes, reductions or
// collectives: every rank fails with an error naming both calls; nothing is
// corrupted and the group stays usable.
BOOST_AUTO_TEST_CASE(mismatched_calls_fail_on_every_rank_naming_both, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options();
    opts.check_calls = true;
    auto pg = job.group(r, 3, opts);
    std::vector<float> v(r == 1 ? 999 : 1000, 1.0f);
    auto msg = require_throws<cc::collective_error>([&] { pg->allreduce(v).get(); }, "sizes differ");
    RANK_REQUIRE(msg.find("allreduce #0") != std::string::npos);
    RANK_REQUIRE(msg.find("allreduce #0 (float32 x 999, sum)") != std::string::npos);
    RANK_REQUIRE(msg.find("allreduce #0 (float32 x 1000, sum)") != std::string::npos);
    RANK_REQUIRE(msg.find("rank 1 called") != std::string::npos);
    RANK_REQUIRE(v[0] == 1.0f); // untouched

    std::vector<double> d(10, 1.0);
    std::vector<float> f(10, 1.0f);
    msg = require_throws<cc::collective_error>(
        [&] { (r == 2 ? pg->allreduce(d) : pg->allreduce(f)).get(); }, "dtypes differ");
    RANK_REQUIRE(msg.find("float64 x 10") != std::string::npos && msg.find("float32 x 10") != std::string::npos);

    msg = require_throws<cc::collective_error>(
        [&] { pg->allreduce(f, r == 0 ? cc::reduce_op::max : cc::reduce_op::sum).get(); }, "reductions differ");
    RANK_REQUIRE(msg.find("max") != std::string::npos);

    msg = require_throws<cc::collective_error>([&] { (r == 0 ? pg->broadcast(f, 0) : pg->allreduce(f)).get(); },
                                               "collectives differ");
    RANK_REQUIRE(msg.find("broadcast #3 (float32 x 10, root 0)") != std::string::npos);

    RANK_REQUIRE(!pg->aborted());
    std::vector<float> ok(1000, static_cast<float>(r));
    pg->allreduce(ok).get(); // still usable
    RANK_REQUIRE(ok[0] == 3.0f && ok[999] == 3.0f);
  }));
}

// A late rank is not a mismatch: the ranks that wait for it compare their
// calls through the store (the stall probe; each then says in
// "<prefix>/waiting/<rank>" which collective it waits in, which the late
// rank waits for before it issues), find them the same, and the late rank's
// same call then completes as usual. Each rank is late once.
BOOST_AUTO_TEST_CASE(a_late_rank_is_not_a_mismatch, *utf::timeout(60)) {
  thread_ranks job;
  constexpr int n = 3;
  require_all_ok(job.run(n, [&](int r) {
    auto opts = gloo_test_options("late");
    opts.mismatch_probe_delay = 20ms;
    auto pg = job.group(r, n, opts);
    corodist::store::sync_store s(job.store);
    for (int late = 0; late < n; ++late) {
      std::vector<float> v(1000, static_cast<float>(r + 1));
      if (r == late)
        for (int other = 0; other < n; ++other)
          if (other != late) // its allreduce #late stalled and was compared
            wait_for_value(s, "late/waiting/" + std::to_string(other),
                           "collective #" + std::to_string(late) + ": allreduce(float32 x 1000, sum)", 10s);
      pg->allreduce(v).get();
      RANK_REQUIRE(v[0] == 6.0f && v[999] == 6.0f);
    }
    RANK_REQUIRE(!pg->aborted());
  }));
}

// Cancelling the await of a work ends the wait with operation_aborted, not the
// collective: it completes once the other rank joins, and the group goes on.
BOOST_AUTO_TEST_CASE(a_cancelled_await_of_a_work_leaves_the_collective_running, *utf::timeout(60)) {
  thread_ranks job;
  corodist::event_loop awaiting;
  awaiting.start();
  std::promise<void> cancelled;
  std::shared_future<void> cancelled_seen = cancelled.get_future().share();
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2, gloo_test_options("cancel"));
    std::vector<float> v(1000, static_cast<float>(r + 1));
    if (r == 1) {
      RANK_REQUIRE(cancelled_seen.wait_for(30s) == std::future_status::ready); // rank 0 gave up waiting first
      pg->allreduce(v).get();
    } else {
      auto w = pg->allreduce(v); // cannot complete before rank 1 issues its own
      asio::cancellation_signal cancel;
      std::promise<std::exception_ptr> ended;
      asio::post(awaiting.get_executor(), [&] {
        asio::co_spawn(
            awaiting.get_executor(), [&]() -> asio::awaitable<void> { co_await std::move(w); },
            asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) { ended.set_value(e); }));
        // Queued behind the coroutine's start: it is waiting on the work by then.
        asio::post(awaiting.get_executor(), [&] { cancel.emit(asio::cancellation_type::terminal); });
      });
      auto outcome = ended.get_future();
      if (outcome.wait_for(10s) != std::future_status::ready) {
        cancelled.set_value();
        RANK_REQUIRE(!"the cancelled await ended");
      }
      const bool aborted = corodist::test::not_operation_aborted(outcome.get()).empty();
      const bool still_running = !w.is_completed();
      cancelled.set_value();
      RANK_REQUIRE(aborted);
      RANK_REQUIRE(still_running);
      w.get(); // the collective itself ran to its end
      RANK_REQUIRE(v[0] == 3.0f && v[999] == 3.0f);
    }
    std::vector<float> u(10, 1.0f);
    pg->allreduce(u).get();
    RANK_REQUIRE(u[0] == 2.0f);
    RANK_REQUIRE(!pg->aborted());
  }));
}

// Groups sharing a store keep their keys under their prefixes and work side
// by side; a prefix already in use is refused.
BOOST_AUTO_TEST_CASE(store_keys_go_under_the_group_prefix, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(4, [&](int t) {
    const int r = t % 2;
    auto pg = job.group(r, 2, gloo_test_options(t < 2 ? "jobA/pg" : "jobB/pg"));
    std::vector<std::int32_t> v(100, t < 2 ? 1 : 10);
    pg->allreduce(v).get();
    RANK_REQUIRE(v[0] == (t < 2 ? 2 : 20));
  }));
  corodist::store::sync_store s(job.store);
  auto keys = s.list_keys();
  BOOST_TEST(!keys.empty());
  for (const auto& k : keys)
    BOOST_TEST((k.rfind("jobA/pg/", 0) == 0 || k.rfind("jobB/pg/", 0) == 0), k);
  for (const char* k : {"jobA/pg/0", "jobA/pg/1", "jobA/pg/rank_0", "jobB/pg/rank_1", "jobA/pg/claimed/0"})
    BOOST_TEST(s.check({k}), k);
  BOOST_CHECK_EXCEPTION(job.group(0, 2, gloo_test_options("jobA/pg")), corodist::usage_error,
                        [](const auto& e) { return std::string(e.what()).find("already used") != std::string::npos; });
}

// Consecutive collectives go to consecutive groups.
BOOST_AUTO_TEST_CASE(round_robin_spreads_collectives_over_groups, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    std::vector<std::shared_ptr<cc::process_group>> groups;
    for (int i = 0; i < 3; ++i)
      groups.push_back(job.group(r, 2, gloo_test_options("rr/" + std::to_string(i))));
    cc::round_robin_group rr(groups);
    std::vector<std::vector<float>> bufs;
    for (int i = 0; i < 9; ++i)
      bufs.emplace_back(1000 + i, static_cast<float>(i * (r + 1)));
    std::vector<cc::work> works;
    for (auto& b : bufs)
      works.push_back(rr.allreduce(b));
    for (auto& w : works)
      w.get();
    for (int i = 0; i < 9; ++i)
      RANK_REQUIRE(bufs[static_cast<std::size_t>(i)].back() == static_cast<float>(3 * i));
    for (auto& g : groups)
      RANK_REQUIRE(g->sequence_number() == 3u);
    RANK_REQUIRE(rr.sequence_number() == 9u);
    rr.barrier().get();
    RANK_REQUIRE(groups[0]->sequence_number() == 4u);
  }));
}

// abort() ends a collective blocked on a peer at once (not at its deadline),
// and the peer's next collective fails too; destroying a group with a
// collective in flight does not wait for its deadline either.
BOOST_AUTO_TEST_CASE(abort_and_destruction_end_blocked_collectives_promptly, *utf::timeout(60)) {
  thread_ranks job;
  std::promise<void> aborted;
  auto aborted_f = aborted.get_future().share();
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    std::vector<float> v(1000, 1.0f);
    if (r == 0) {
      auto w = pg->allreduce(v); // rank 1 never joins
      RANK_REQUIRE(!w.is_completed());
      const auto t0 = clock_type::now();
      pg->abort("test over");
      auto msg = require_throws<cc::collective_error>([&] { w.get(); }, "the blocked allreduce");
      RANK_REQUIRE(seconds_since(t0) < 2.0);
      RANK_REQUIRE(msg.find("aborted by the user: test over") != std::string::npos);
      RANK_REQUIRE(pg->aborted());
      aborted.set_value();
    } else {
      RANK_REQUIRE(aborted_f.wait_for(20s) == std::future_status::ready);
      const auto t0 = clock_type::now();
      require_throws<cc::collective_error>([&] { pg->allreduce(v).get(); }, "rank 1 after rank 0 aborted");
      RANK_REQUIRE(seconds_since(t0) < 2.0);
    }
  }));
  std::promise<void> destroyed;
  auto destroyed_f = destroyed.get_future().share();
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2, gloo_test_options("destroyed"));
    pg->barrier().get(); // both connected
    if (r == 1) { // keeps its group, idle, until rank 0 is done
      RANK_REQUIRE(destroyed_f.wait_for(20s) == std::future_status::ready);
      return;
    }
    std::vector<float> v(1000, 1.0f);
    auto w = pg->allreduce(v); // rank 1 never joins
    const auto t0 = clock_type::now();
    pg.reset();
    const double took = seconds_since(t0);
    destroyed.set_value();
    RANK_REQUIRE(took < 2.0);
    require_throws<cc::collective_error>([&] { w.get(); }, "allreduce of a destroyed group");
  }));
}

// Creation from a rendezvous URL (file://).
BOOST_AUTO_TEST_CASE(create_from_a_rendezvous_url, *utf::timeout(60)) {
  const corodist::test::temp_file file;
  corodist::event_loop loop;
  loop.start();
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto url = "file://" + file.path + "?rank=" + std::to_string(r) + "&world_size=2";
    auto pg = cc::gloo_group::create_sync(loop, url, gloo_test_options());
    RANK_REQUIRE(pg->rank() == r && pg->size() == 2);
    std::vector<std::uint8_t> v(10, static_cast<std::uint8_t>(r + 1));
    pg->allreduce(v, cc::reduce_op::product).get();
    RANK_REQUIRE(v[9] == 2);
  }));
}

BOOST_AUTO_TEST_SUITE_END()
