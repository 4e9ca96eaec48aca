// The Gloo backend's exchanges beyond the classic collectives, ranks as
// threads of this process: point-to-point (single, batched, from any rank),
// all-to-all (even, skewed, lists), gather, scatter, reduce, allgatherv and
// monitored_barrier; a cancelled await; what a send with no matching receive, split lists that
// disagree and missing ranks do; bad arguments.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/round_robin_group.hpp>
#include <corodist/core/error.hpp>

#include "collective/collective_checks.hpp"
#include "collective/gloo_fixtures.hpp"
#include "support/cancel.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <future>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
using corodist::test::gloo_test_options;
using corodist::test::require_all_ok;
using corodist::test::require_throws;
using corodist::test::thread_ranks;

namespace {


bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

BOOST_AUTO_TEST_SUITE(gloo_exchanges, *utf::precondition(corodist::test::gloo_built))

BOOST_AUTO_TEST_CASE(every_exchange_on_one_two_and_three_thread_ranks, *utf::timeout(180)) {
  for (int n : {1, 2, 3}) {
    thread_ranks job;
    require_all_ok(job.run(n, [&](int r) {
      auto pg = job.group(r, n);
      auto f = corodist::test::check_every_new_operation(*pg);
      RANK_REQUIRE(f.ok() || (throw std::runtime_error(f.text()), false));
      RANK_REQUIRE(pg->sequence_number() > 0);
    }));
  }
}

BOOST_AUTO_TEST_CASE(every_exchange_with_call_checks_on, *utf::timeout(180)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options();
    opts.check_calls = true;
    auto pg = job.group(r, 3, opts);
    auto f = corodist::test::check_every_new_operation(*pg);
    RANK_REQUIRE(f.ok() || (throw std::runtime_error(f.text()), false));
  }));
}

// Point-to-point calls are not numbered with the collectives, so that ranks
// which do not take part in an exchange stay in step.
BOOST_AUTO_TEST_CASE(point_to_point_leaves_the_collective_numbers_alone, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto pg = job.group(r, 3);
    std::vector<float> x(4, 1.0f);
    if (r == 0)
      pg->send(x, 1).get();
    else if (r == 1)
      pg->recv(x, 0).get();
    RANK_REQUIRE(pg->sequence_number() == 0);
    std::vector<float> y(4, static_cast<float>(r));
    pg->allreduce(y).get();
    RANK_REQUIRE(y[0] == 3.0f);
  }));
}

// A small send whose receive the peer has posted is written out by Gloo
// within the call, and its work is complete when the call returns; behind a
// receive still pending it waits for it (works complete in issue order).
// Each rank posts its receive before it sends the signal the other waits
// for, and Gloo reads a connection in order, so the posting is known.
BOOST_AUTO_TEST_CASE(a_send_written_at_the_call_completes_there_unless_an_earlier_call_is_pending,
                     *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    std::vector<float> data(4, 1.0f), got(4, 0.0f), signal(1, 0.0f);
    if (r == 0) {
      pg->recv(signal, 1, 1).get(); // rank 1 has posted its receive of tag 0
      auto reply = pg->recv(got, 1, 2); // pending until rank 1 hears tag 3
      auto out = pg->send(data, 1, 0);
      RANK_REQUIRE(!out.is_completed());
      auto go = pg->send(signal, 1, 3);
      out.get();
      RANK_REQUIRE(reply.is_completed());
      go.get();
      pg->recv(signal, 1, 5).get(); // rank 1 has posted its receive of tag 4
      auto second = pg->send(data, 1, 4);
      RANK_REQUIRE(second.is_completed());
      second.get();
    } else {
      auto in = pg->recv(got, 0, 0);
      pg->send(signal, 0, 1).get();
      in.get();
      RANK_REQUIRE(got[0] == 1.0f);
      pg->recv(signal, 0, 3).get();
      pg->send(data, 0, 2).get();
      auto second = pg->recv(got, 0, 4);
      pg->send(signal, 0, 5).get();
      second.get();
    }
  }));
}

// A send whose peer posts no matching receive (here one of another size)
// fails at its deadline on both ranks, naming both and the call, and aborts
// the group; no data lands in the mismatched receive.
BOOST_AUTO_TEST_CASE(a_send_with_no_matching_receive_fails_at_its_deadline_naming_both_ranks, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    cc::call_options o;
    o.timeout = 500ms;
    if (r == 0) {
      std::vector<float> x(4, 7.0f);
      auto msg = require_throws<cc::collective_timeout_error>([&] { pg->send(x, 1, 5, o).get(); }, "send");
      RANK_REQUIRE(has(msg, "send #0 on rank 0 of 2"));
      RANK_REQUIRE(has(msg, "rank 1 posted no matching recv(float32 x 4 from rank 0, tag 5)"));
      RANK_REQUIRE(has(msg, "the group is aborted"));
    } else {
      std::vector<float> y(8, 0.0f);
      auto msg = require_throws<cc::collective_timeout_error>([&] { pg->recv(y, 0, 5, o).get(); }, "recv");
      RANK_REQUIRE(has(msg, "recv #0 on rank 1 of 2"));
      RANK_REQUIRE(has(msg, "rank 0 posted no matching send(float32 x 8 to rank 1, tag 5)"));
      RANK_REQUIRE(y[0] == 0.0f);
    }
    RANK_REQUIRE(pg->aborted());
    std::vector<float> z(1);
    require_throws<cc::collective_error>([&] { pg->allreduce(z).get(); }, "after the abort");
  }));
}

// Split lists that disagree between two ranks: with call checks, every rank
// (the third one too) fails before data moves, naming the pair; the group
// stays usable.
BOOST_AUTO_TEST_CASE(split_lists_that_disagree_fail_on_every_rank_naming_the_pair, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options();
    opts.check_calls = true;
    auto pg = job.group(r, 3, opts);
    // Rank 1 expects 3 elements from rank 0, which sends 2.
    std::vector<std::size_t> ins{2, 2, 2}, outs{2, 2, 2};
    if (r == 1)
      outs = {3, 2, 1};
    std::vector<float> in(6, 1.0f), out(6, -1.0f);
    auto msg = require_throws<cc::collective_error>([&] { pg->all_to_all_single(in, out, ins, outs).get(); },
                                                    "split lists differ");
    RANK_REQUIRE(has(msg, "rank 0 called all_to_all_single sending 2 elements to rank 1, rank 1 expects 3"));
    RANK_REQUIRE(out[0] == -1.0f);
    RANK_REQUIRE(!pg->aborted());
    std::vector<float> ok(6, static_cast<float>(r)), got(6);
    pg->all_to_all_single(ok, got).get();
    RANK_REQUIRE(got[0] == 0.0f && got[2] == 1.0f && got[4] == 2.0f);
  }));
}

// Without call checks, such a pair exchanges nothing (each block's slot
// carries its size): the collective fails at its deadline, no buffer overrun.
BOOST_AUTO_TEST_CASE(split_lists_that_disagree_without_checks_fail_at_the_deadline, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    cc::call_options o;
    o.timeout = 500ms;
    // Rank 1 sends rank 0 two elements; rank 0 expects one.
    std::vector<std::size_t> ins{1, 1}, outs{1, 1};
    if (r == 1)
      ins = {2, 1};
    std::vector<std::int32_t> in(r == 1 ? 3 : 2, 9), out(2, -1);
    require_throws<cc::collective_timeout_error>([&] { pg->all_to_all_single(in, out, ins, outs, o).get(); },
                                                 "mismatched splits");
    RANK_REQUIRE(pg->aborted());
    if (r == 0)
      RANK_REQUIRE(out[1] == -1); // nothing landed in the block from rank 1
  }));
}

// Ranks 2 and 3 never reach the monitored barrier: ranks 0 and 1 fail at its
// deadline, both naming both missing ranks.
BOOST_AUTO_TEST_CASE(monitored_barrier_names_every_rank_that_did_not_arrive, *utf::timeout(60)) {
  thread_ranks job;
  corodist::test::countdown done(2);
  require_all_ok(job.run(4, [&](int r) {
    auto pg = job.group(r, 4);
    if (r >= 2) {
      RANK_REQUIRE(done.wait_for(30s)); // absent until the others have their verdict
      return;
    }
    cc::call_options o;
    o.timeout = 1s;
    auto msg = require_throws<cc::collective_timeout_error>([&] { pg->monitored_barrier(o).get(); }, "barrier");
    done.arrive();
    RANK_REQUIRE(has(msg, "ranks 2, 3 did not reach monitored_barrier"));
    RANK_REQUIRE(has(msg, "of 4 ranks, 2 arrived"));
    RANK_REQUIRE(pg->aborted());
  }));
}

// Cancelling the coroutine that awaits a receive ends the await with
// operation_aborted; the receive stays posted and takes the data sent later.
BOOST_AUTO_TEST_CASE(a_cancelled_await_of_a_receive_leaves_it_posted, *utf::timeout(60)) {
  thread_ranks job;
  corodist::event_loop awaiting;
  awaiting.start();
  std::promise<void> cancelled;
  std::shared_future<void> cancelled_seen = cancelled.get_future().share();
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    std::vector<float> v(100, static_cast<float>(r + 1));
    if (r == 1) {
      RANK_REQUIRE(cancelled_seen.wait_for(30s) == std::future_status::ready);
      pg->send(v, 0, 9).get();
      return;
    }
    auto w = pg->recv(v, 1, 9); // rank 1 sends only after the cancel
    asio::cancellation_signal cancel;
    std::promise<std::exception_ptr> ended;
    asio::post(awaiting.get_executor(), [&] {
      asio::co_spawn(
          awaiting.get_executor(), [&]() -> asio::awaitable<void> { co_await std::move(w); },
          asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) { ended.set_value(e); }));
      asio::post(awaiting.get_executor(), [&] { cancel.emit(asio::cancellation_type::terminal); });
    });
    auto outcome = ended.get_future();
    const bool in_time = outcome.wait_for(10s) == std::future_status::ready;
    const bool aborted = in_time && corodist::test::not_operation_aborted(outcome.get()).empty();
    const bool still_posted = !w.is_completed();
    cancelled.set_value();
    RANK_REQUIRE(in_time && aborted && still_posted);
    w.get();
    RANK_REQUIRE(v[0] == 2.0f && v[99] == 2.0f && w.source_rank() == 1);
    RANK_REQUIRE(!pg->aborted());
  }));
}

// A round-robin group sends point-to-point calls to its first group without
// moving the rotation: rank 2, which takes no part in them, stays in step.
BOOST_AUTO_TEST_CASE(round_robin_keeps_point_to_point_out_of_the_rotation, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    std::vector<std::shared_ptr<cc::process_group>> groups;
    for (int i = 0; i < 2; ++i)
      groups.push_back(job.group(r, 3, gloo_test_options("rr_p2p/" + std::to_string(i))));
    cc::round_robin_group rr(groups);
    std::vector<float> x(8, 5.0f);
    if (r == 0)
      rr.send(x, 1).get();
    else if (r == 1)
      rr.recv(x, 0).get();
    std::vector<float> y(8, static_cast<float>(r));
    rr.allreduce(y).get();
    RANK_REQUIRE(y[0] == 3.0f && x[0] == 5.0f);
    RANK_REQUIRE(rr.sequence_number() == 1u);
    RANK_REQUIRE(groups[0]->sequence_number() == 1u && groups[1]->sequence_number() == 0u);
  }));
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused_at_the_call, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(2, [&](int r) {
    auto pg = job.group(r, 2);
    std::vector<float> a(4), b(4), c(3);
    auto msg = require_throws<corodist::usage_error>([&] { (void)pg->send(a, r); }, "send to self");
    RANK_REQUIRE(has(msg, "is this rank"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->recv(a, 5); }, "peer out of range");
    RANK_REQUIRE(has(msg, "peer 5 is not a rank of this group of 2"));
    msg = require_throws<corodist::usage_error>(
        [&] { (void)pg->batch_isend_irecv({cc::p2p_op::irecv(a, cc::any_source)}); }, "any_source in a batch");
    RANK_REQUIRE(has(msg, "only a single recv"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->batch_isend_irecv({}); }, "empty batch");
    msg = require_throws<corodist::usage_error>([&] { (void)pg->all_to_all_single(a, c); }, "uneven without splits");
    RANK_REQUIRE(has(msg, "must split evenly"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->all_to_all_single(a, b, {1, 2}, {}); }, "bad sum");
    RANK_REQUIRE(has(msg, "in_splits adds up to 3 elements but the input has 4"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->all_to_all_single(a, a); }, "in place");
    RANK_REQUIRE(has(msg, "overlap"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->all_to_all({a}, {b}); }, "list sizes");
    if (r == 0) { // (the root's output only: the others' is ignored)
      msg = require_throws<corodist::usage_error>([&] { (void)pg->gather(a, b, 0); }, "gather output");
      RANK_REQUIRE(has(msg, "the root's output must hold size() x input"));
    }
    msg = require_throws<corodist::usage_error>([&] { (void)pg->reduce(a, 2); }, "root");
    RANK_REQUIRE(has(msg, "root 2 is not a rank"));
    msg = require_throws<corodist::usage_error>([&] { (void)pg->allgatherv(a, b, {4}); }, "counts");
    RANK_REQUIRE(has(msg, "counts has 1 entries"));
    RANK_REQUIRE(!pg->aborted());
    RANK_REQUIRE(pg->sequence_number() == 0);
  }));
}

BOOST_AUTO_TEST_SUITE_END()
