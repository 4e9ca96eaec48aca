// Cancelling the DDP reducer's awaitables mid-flight through Asio's
// cancellation slot, with two ranks as threads of this process on Gloo over
// loopback: what reducer.hpp's "Cancellation:" lines promise. finalize() is
// not cancellable (the iteration's collectives use the reducer's memory): a
// cancel request while it waits lets it finish with the right gradients and
// takes effect at the awaiting coroutine's next co_await. create() cancelled
// at its first collective ends with operation_aborted and no reducer; that
// collective goes on (the other rank's construction meets it, then times out
// at the next one, which never comes) and the memory it writes stays valid
// until it ends (the sanitizer build checks that). Linked into the ddp test
// executable.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/ddp/reducer.hpp>

#include "collective/gloo_fixtures.hpp"
#include "ddp/reducer_fixtures.hpp"
#include "support/cancel.hpp"

#include <asio/cancellation_signal.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace dd = corodist::ddp;
using corodist::event_loop;
using corodist::test::thread_ranks;
using namespace corodist::test::reducer_fixtures;

namespace {

const std::vector<std::size_t> sizes = {300, 7, 1000, 64, 129};

/// Awaits `red.finalize()`, notes that it returned, then awaits once more (a
/// post): where a cancellation of this coroutine takes effect.
asio::awaitable<void> finalize_then_go_on(dd::reducer& red, std::atomic<bool>& finalized) {
  co_await red.finalize();
  finalized = true;
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
}

/// `out = co_await reducer::create(...)` (a named coroutine: its parameters
/// live in its frame).
asio::awaitable<void> create_into(std::unique_ptr<dd::reducer>& out, asio::any_io_executor ex,
                                  std::shared_ptr<cc::process_group> pg, std::vector<dd::parameter> params) {
  dd::reducer_options o;
  out = co_await dd::reducer::create(ex, std::move(pg), std::move(params), o);
}

/// Spawns `op` on `loop` with `cancel`'s slot, then (behind the coroutine's
/// start: it is waiting by then) emits a terminal cancellation; returns once
/// emitted, with how the coroutine ends.
std::future<std::exception_ptr> spawn_and_cancel(event_loop& loop, asio::awaitable<void> op,
                                                 asio::cancellation_signal& cancel) {
  std::promise<std::future<std::exception_ptr>> spawned;
  std::promise<void> emitted;
  asio::post(loop.get_executor(), [&] {
    spawned.set_value(corodist::test::spawn_cancellable(loop.get_executor(), std::move(op), cancel));
    asio::post(loop.get_executor(), [&] {
      cancel.emit(asio::cancellation_type::terminal);
      emitted.set_value();
    });
  });
  auto ended = spawned.get_future().get();
  RANK_REQUIRE(emitted.get_future().wait_for(10s) == std::future_status::ready);
  return ended;
}

void require_none(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r)
    BOOST_TEST(errors[r].empty(), "rank " << r << ": " << errors[r]);
}

} // namespace

BOOST_AUTO_TEST_SUITE(ddp_cancellation, *utf::precondition(corodist::test::gloo_built))

// Rank 0 asks to cancel its finalize() while it waits for rank 1 (which marks
// its gradients only after that): finalize still returns, with the averaged
// gradients; the coroutine's next co_await ends it with operation_aborted; the
// next iteration runs as usual.
BOOST_AUTO_TEST_CASE(a_cancel_request_during_finalize_does_not_cancel_it, *utf::timeout(120)) {
  thread_ranks job;
  std::promise<void> emitted_p;
  std::shared_future<void> emitted = emitted_p.get_future().share();
  require_none(job.run(2, [&](int r) {
    auto pg = job.group(r, 2, corodist::test::gloo_test_options("ddp-cancel-finalize"));
    model<float> m(sizes);
    event_loop loop;
    loop.start();
    dd::reducer red(loop.get_executor(), pg, m.parameters());
    for (int it = 0; it < 2; ++it) {
      red.prepare_for_backward();
      if (r == 1 && it == 0)
        RANK_REQUIRE(emitted.wait_for(30s) == std::future_status::ready); // rank 0 asked first
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        fill_grad<float>(red, r, it, k);
        red.mark_grad_ready(k);
      }
      if (r == 0 && it == 0) {
        // Its buckets' allreduces are launched and cannot end before rank 1's.
        asio::cancellation_signal cancel;
        std::atomic<bool> finalized{false};
        auto ended = spawn_and_cancel(loop, finalize_then_go_on(red, finalized), cancel);
        emitted_p.set_value();
        RANK_REQUIRE(ended.wait_for(30s) == std::future_status::ready);
        const auto why = corodist::test::not_operation_aborted(ended.get());
        RANK_REQUIRE(finalized); // finalize itself was not cancelled
        if (!why.empty())
          throw std::runtime_error("the coroutine's next co_await: " + why);
      } else {
        red.finalize_sync();
      }
      for (std::size_t k = 0; k < sizes.size(); ++k)
        check_mean<float>(red, 2, it, k);
    }
    RANK_REQUIRE(red.iterations() == 2u);
  }));
}

// Rank 0's create() cancelled while its first collective waits for rank 1:
// it ends with operation_aborted and no reducer. Rank 1's construction then
// meets that collective and times out at the next one, which rank 0 never
// issues; rank 0's memory for the first one stays valid until it ends.
BOOST_AUTO_TEST_CASE(a_cancelled_create_ends_without_a_reducer, *utf::timeout(120)) {
  thread_ranks job;
  std::promise<void> cancelled_p, rank1_done_p;
  std::shared_future<void> cancelled = cancelled_p.get_future().share();
  std::shared_future<void> rank1_done = rank1_done_p.get_future().share();
  require_none(job.run(2, [&](int r) {
    // A short group deadline: rank 1's construction is expected to time out.
    auto pg = job.group(r, 2, corodist::test::gloo_test_options("ddp-cancel-create", 3s));
    model<float> m(sizes);
    event_loop loop;
    loop.start();
    if (r == 1) {
      struct done_at_exit {
        std::promise<void>& p;
        ~done_at_exit() { p.set_value(); }
      } at_exit{rank1_done_p};
      RANK_REQUIRE(cancelled.wait_for(30s) == std::future_status::ready);
      corodist::test::require_throws<cc::collective_timeout_error>(
          [&] { dd::reducer red(loop.get_executor(), pg, m.parameters()); }, "rank 1's construction");
      return;
    }
    std::unique_ptr<dd::reducer> made;
    asio::cancellation_signal cancel;
    auto ended = spawn_and_cancel(loop, create_into(made, loop.get_executor(), pg, m.parameters()), cancel);
    RANK_REQUIRE(ended.wait_for(10s) == std::future_status::ready);
    const auto why = corodist::test::not_operation_aborted(ended.get());
    cancelled_p.set_value();
    if (!why.empty())
      throw std::runtime_error("create: " + why);
    RANK_REQUIRE(!made);
    RANK_REQUIRE(rank1_done.wait_for(60s) == std::future_status::ready); // the group stays until rank 1 is done
  }));
}

BOOST_AUTO_TEST_SUITE_END()
