// RRef-enabled agents as threads of this process over an in-memory store (the
// agent's and the RRef protocol's real code). Graceful shutdown while the
// application still holds RRefs: an RRef made by remote(), passed back to its
// owner and to a third worker; for every subset of workers that still hold it
// and both orders of shutdown, every shutdown() returns without error and
// without waiting out its timeout, and the handles left behind fail clearly
// (or, on the owner, still reach the value) -- also once the agents are gone.
// And to_here() on the owner keeps its deadline. Linked into the rref test
// executable.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/debug_info.hpp>
#include <corodist/rref/remote.hpp>
#include <corodist/store/sync_store.hpp>

#include "rpc/rpc_fixtures.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace rr = corodist::rref;
using corodist::test::cluster;

namespace {

constexpr int creator = 0, owner = 1, third = 2;

// The message of `f`'s failure, if it fails with E; otherwise "" (it
// succeeded) or "not E: <what>" (it failed otherwise), so that a check on the
// message says what happened instead.
template <typename E, typename F>
std::string failure_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not the expected type: ") + typeid(e).name() + ": " + e.what();
  } catch (...) {
    return "not the expected type: not a std::exception";
  }
  return {};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// One run: `holders` (bit r: worker r) still hold the RRef at shutdown;
// `owner_first`: the owner calls shutdown() first, else the users do.
void run(unsigned holders, bool owner_first) {
  const std::string what = "holders {" + std::string(holders & 1 ? " w0" : "") + (holders & 2 ? " w1" : "") +
                           (holders & 4 ? " w2" : "") + " }, " + (owner_first ? "owner first" : "users first");
  BOOST_TEST_CONTEXT(what) {
    // Outlive the cluster: handles destroyed after their agents and loops.
    std::array<rr::rref<int>, 3> kept;
    rr::rref<int> created;
    {
      // A long timeout: a shutdown that waited for it is caught by the bounded wait below.
      cluster c(3, [](rpc::agent_options& o) { o.shutdown_timeout = 60s; }, false);
      for (int r = 0; r < 3; ++r) {
        auto& a = c[r];
        rr::enable(a);
        a.register_function("make", [](int v) { return v; });
        a.register_function("keep", [&kept, r](rr::rref<int> ref) {
          kept[static_cast<std::size_t>(r)] = ref;
          return ref.is_owner();
        });
        a.register_function("drop", [&kept, r] { kept[static_cast<std::size_t>(r)] = {}; });
      }
      c.start_all();
      created = rr::remote<int>(c[creator], "w1", "make", 7);
      BOOST_TEST(created.to_here().get() == 7);
      BOOST_TEST(c[creator].rpc_sync<bool>("w1", "keep", created)); // back to its owner, held there
      BOOST_TEST(!c[creator].rpc_sync<bool>("w2", "keep", created)); // a second user
      for (int r : {owner, third})
        if (!(holders & (1u << r)))
          c[creator].rpc_sync<void>(r, "drop");
      if (!(holders & 1u))
        created = {};

      // Shutdown, in the given order: the second group starts once the first
      // has entered the join (its first round's key is in the store).
      const std::vector<int> first = owner_first ? std::vector<int>{owner} : std::vector<int>{creator, third};
      std::vector<std::string> entered;
      for (int r : first)
        entered.push_back("corodist/rpc/join/0/" + std::to_string(r));
      auto done = std::async(std::launch::async, [&] {
        c.for_each_agent([&](rpc::agent& a, int r) {
          if (std::find(first.begin(), first.end(), r) == first.end())
            corodist::store::sync_store(c.store).wait(entered, 20s);
          a.shutdown();
        });
      });
      BOOST_TEST_REQUIRE((done.wait_for(20s) == std::future_status::ready), "every shutdown() returned");
      BOOST_CHECK_NO_THROW(done.get());

      // Nothing is left of the protocol but the owner's value, if the application holds it there.
      for (int r = 0; r < 3; ++r) {
        const auto i = rr::info(c[r]);
        const bool owner_holds = r == owner && (holders & 2u);
        BOOST_TEST(i.owners == (owner_holds ? 1u : 0u), "worker " << r << " owners");
        BOOST_TEST(i.users + i.pending_users + i.pending_children + i.forks + i.unacked == 0u,
                   "worker " << r << " holds no fork or message");
      }

      // The handles left: users fail clearly; the owner still has its value.
      if (holders & 1u) {
        auto copy = created; // copies are local
        const auto e = failure_of<corodist::usage_error>([&] { copy.to_here().get(); });
        BOOST_TEST(e == "to_here of RRef R" + created.id().str() + " owned by 'w1': agent 'w0' is shut down");
        BOOST_CHECK_THROW(created.rpc_sync<int>("make"), corodist::usage_error);
      }
      if (holders & 4u)
        BOOST_CHECK_THROW(kept[third].to_here().get(), corodist::usage_error);
      if (holders & 2u) {
        int value = 0, fetched = 0;
        BOOST_CHECK_NO_THROW(value = *kept[owner].local_value());
        BOOST_CHECK_NO_THROW(fetched = kept[owner].to_here().get());
        BOOST_TEST(value == 7);
        BOOST_TEST(fetched == 7);
      }

      // The agents go; the handles stay, and fail clearly.
      c.agents.clear();
      for (auto* h : {&created, &kept[0], &kept[1], &kept[2]}) {
        if (!h->valid())
          continue;
        auto copy = *h;
        const auto e = failure_of<corodist::usage_error>([&] { copy.to_here().get(); });
        BOOST_TEST(has(e, "to_here of RRef R" + copy.id().str()), e);
        BOOST_CHECK_THROW(copy.local_value(), corodist::usage_error);
      }
      if (holders & 1u) // one handle goes while the loops still run
        created = {};
    }
  } // the others go after the loops, too
}

} // namespace

BOOST_AUTO_TEST_SUITE(rref_threads)

BOOST_AUTO_TEST_CASE(shutdown_with_references_held, *utf::timeout(240)) {
  for (bool owner_first : {true, false})
    for (unsigned holders = 0; holders < 8; ++holders)
      run(holders, owner_first);
}

// to_here() on the owner, before its function has finished: a timeout_error at
// its deadline (it used to wait for the function, however long), and the value
// once the function is done.
BOOST_AUTO_TEST_CASE(to_here_on_the_owner_keeps_its_deadline, *utf::timeout(60)) {
  cluster c(1, {}, false);
  rr::enable(c[0]);
  std::promise<void> release;
  auto released = release.get_future().share();
  c[0].register_function("slow", [released](int v) {
    released.wait_for(30s); // until the test lets it finish
    return v;
  });
  c.start_all();
  auto r = rr::remote<int>(c[0], "w0", "slow", 5); // to itself: the owner
  auto early = r.to_here(100ms);
  BOOST_TEST_REQUIRE(early.wait_for(10s));
  const auto e = failure_of<corodist::timeout_error>([&] { early.get(); });
  BOOST_TEST(e == "to_here of RRef R" + r.id().str() + " on its owner 'w0': its function did not finish within 100 ms");
  release.set_value();
  BOOST_TEST(r.to_here().get() == 5);
  c.shutdown_all();
}

BOOST_AUTO_TEST_SUITE_END()
