// Cancelling the awaitables of an rref mid-flight, through Asio's
// cancellation slot, on RRef-enabled agents as threads of this process: a
// wait on to_here()'s future (every cancellation type, on a user and on the
// owner) and a method call (rref::call). Each checks what rref.hpp's
// "Cancellation:" lines promise: the wait ends with operation_aborted, the
// work on the owner goes on to its end, the reference and the agent stay
// usable, and the reference counts come out right (nothing is left once the
// handles go and the agents shut down). Linked into the rref test executable.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rref/debug_info.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/register_method.hpp>
#include <corodist/rref/remote.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "support/cancel.hpp"
#include "support/loop_helpers.hpp"

#include <asio/cancellation_signal.hpp>

#include <chrono>
#include <future>
#include <string>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace rr = corodist::rref;
using corodist::test::cluster;
using corodist::test::on_loop;

namespace {

/// A function (or method) held on its worker until the test releases it:
/// while it runs, the RRef's value (or the call's result) cannot be there.
struct held {
  std::promise<void> entered_p;
  std::promise<void> release_p;
  std::shared_future<void> released = release_p.get_future().share();
  std::promise<void> finished_p;

  /// Called by the function: it is running; waits for the release.
  void enter() {
    entered_p.set_value();
    released.wait_for(30s);
  }
  bool entered() { return entered_p.get_future().wait_for(10s) == std::future_status::ready; }
  void release() { release_p.set_value(); }
  bool finished() { return finished_p.get_future().wait_for(10s) == std::future_status::ready; }
};

/// Nothing is left of the RRef protocol on any worker (after shutdown, with
/// no handle held).
void check_nothing_left(cluster& c, int n) {
  for (int r = 0; r < n; ++r) {
    const auto i = rr::info(c[r]);
    BOOST_TEST(i.owners + i.users + i.pending_users + i.pending_children + i.forks + i.unacked == 0u,
               "worker " << r << " still holds " << i.owners << " owners, " << i.users << " users, "
                         << i.pending_users << " pending users, " << i.pending_children << " pending children, "
                         << i.forks << " forks, " << i.unacked << " unacknowledged messages");
  }
}

const char* name(asio::cancellation_type t) {
  switch (t) {
  case asio::cancellation_type::terminal:
    return "terminal";
  case asio::cancellation_type::partial:
    return "partial";
  default:
    return "total";
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(rref_cancellation)

// A user's wait on to_here() cancelled (each type) while the owner's function
// still runs: the wait ends with operation_aborted; the fetch goes on, and its
// value lands in the same future once the function is done; the reference
// fetches again, the agent calls on, and the counts stay right.
BOOST_AUTO_TEST_CASE(a_cancelled_to_here_wait_leaves_the_fetch_and_the_reference, *utf::timeout(120)) {
  for (auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                    asio::cancellation_type::total}) {
    BOOST_TEST_CONTEXT(name(type) << " cancellation") {
      held slow;
      cluster c(2, {}, false);
      for (int r = 0; r < 2; ++r)
        rr::enable(c[r]);
      c[1].register_function("slow", [&slow](int v) {
        slow.enter();
        return v;
      });
      c.start_all();
      auto& loop0 = *c.loops[0];
      {
        auto ref = rr::remote<int>(c[0], "w1", "slow", 5);
        BOOST_REQUIRE(slow.entered()); // the owner runs it: no value before the release
        auto f = ref.to_here();
        asio::cancellation_signal cancel;
        std::future<std::exception_ptr> ended;
        on_loop(loop0, [&] { f.async_get(corodist::test::cancellable_token(loop0.get_executor(), cancel, ended)); });
        on_loop(loop0, [&] { cancel.emit(type); });
        corodist::test::require_cancelled(ended);
        BOOST_TEST(!f.is_ready());
        slow.release();
        BOOST_TEST(f.get() == 5); // the fetch went on to its end
        BOOST_TEST(ref.to_here().get() == 5);
        BOOST_TEST(c[0].rpc_sync<int>("w1", "add", 2, 3) == 5);
        const auto user = rr::info(c[0]), owner = rr::info(c[1]);
        BOOST_TEST(user.users == 1u);
        BOOST_TEST(user.pending_users == 0u);
        BOOST_TEST(owner.owners == 1u);
        BOOST_TEST(owner.forks == 1u);
      } // the handle goes: the owner may delete the value
      c.shutdown_all();
      check_nothing_left(c, 2);
    }
  }
}

// to_here() on the owner itself, from a coroutine cancelled (terminal) while
// the function runs: the wait ends with operation_aborted, the value lands in
// the future, and the owner's reference holds it.
BOOST_AUTO_TEST_CASE(a_cancelled_to_here_on_the_owner_leaves_the_value, *utf::timeout(60)) {
  held slow;
  cluster c(1, {}, false);
  rr::enable(c[0]);
  c[0].register_function("slow", [&slow](int v) {
    slow.enter();
    return v;
  });
  c.start_all();
  auto& loop0 = *c.loops[0];
  {
    auto ref = rr::remote<int>(c[0], "w0", "slow", 6); // to itself: the owner
    BOOST_REQUIRE(slow.entered());
    auto f = ref.to_here();
    asio::cancellation_signal cancel;
    auto ended = on_loop(loop0, [&] { return corodist::test::spawn_cancellable(loop0.get_executor(), f.async_get(), cancel); });
    on_loop(loop0, [&] { cancel.emit(asio::cancellation_type::terminal); });
    corodist::test::require_cancelled(ended);
    slow.release();
    BOOST_TEST(f.get() == 6);
    BOOST_TEST(*ref.local_value() == 6);
    BOOST_TEST(ref.to_here().get() == 6);
    BOOST_TEST(rr::info(c[0]).owners == 1u);
  }
  c.shutdown_all();
  check_nothing_left(c, 1);
}

// A method call (rref::call) cancelled while the owner runs the method: the
// call ends with operation_aborted at once; the owner runs the method to its
// end (the value changes), and the reference takes further calls.
BOOST_AUTO_TEST_CASE(a_cancelled_method_call_runs_to_its_end_on_the_owner, *utf::timeout(60)) {
  held method;
  cluster c(2, {}, false);
  for (int r = 0; r < 2; ++r)
    rr::enable(c[r]);
  c[1].register_function("make", [](int v) { return v; });
  rr::register_method<int>(c[1], "add_held", [&method](int& v, int by) {
    method.enter();
    v += by;
    method.finished_p.set_value();
    return v;
  });
  rr::register_method<int>(c[1], "add_to", [](int& v, int by) { return v += by; });
  c.start_all();
  auto& loop0 = *c.loops[0];
  {
    auto ref = rr::remote<int>(c[0], "w1", "make", 7);
    BOOST_REQUIRE(ref.to_here().get() == 7);
    asio::cancellation_signal cancel;
    auto ended =
        on_loop(loop0, [&] { return corodist::test::spawn_cancellable(loop0.get_executor(), ref.call<int>("add_held", 3), cancel); });
    BOOST_REQUIRE(method.entered()); // mid-flight on the owner
    on_loop(loop0, [&] { cancel.emit(asio::cancellation_type::terminal); });
    corodist::test::require_cancelled(ended);
    method.release();
    BOOST_REQUIRE(method.finished()); // the owner ran it to its end
    BOOST_TEST(ref.to_here().get() == 10);
    BOOST_TEST(ref.rpc_sync<int>("add_to", 1) == 11);
    BOOST_TEST(ref.confirmed_by_owner());
    BOOST_TEST(rr::info(c[1]).owners == 1u);
  }
  c.shutdown_all();
  check_nothing_left(c, 2);
}

BOOST_AUTO_TEST_SUITE_END()
