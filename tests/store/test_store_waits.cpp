// Many waits at once (a barrier of 98K waiters): the engine's
// deadlines (one index and one timer for every wait, not a timer per wait)
// and the client-side log of long waits (a warning round costs the waits due,
// and the waits due together warn in one line that counts them). Linked into
// the store test executable.
#include <boost/test/unit_test.hpp>

#include "store/server/engine.hpp"
#include "store/log_capture.hpp"
#include "store/wait_log.hpp"

#include <asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

// 2,000 waits over four owners (connections) with staggered timeouts: the
// even ones, each on a key nobody sets, with timeouts of 30 ms to 1 s in an
// order unlike their registration, time out with their key missing and in
// deadline order; the odd ones, on a barrier key (one in ten also on a
// second key), with timeouts of 20 s and more, are woken by the barrier's set
// (and the second key's), except those of a fifth owner that left first,
// which never complete. Nothing is left held, and no timer keeps the loop
// running once no deadline is pending (run() returns).
BOOST_AUTO_TEST_CASE(many_waits_time_out_in_deadline_order_or_wake, *utf::timeout(60)) {
  asio::io_context ctx;
  auto eng = std::make_shared<cs::detail::engine>(ctx.get_executor());
  using clock = std::chrono::steady_clock;
  constexpr int n = 2000;
  struct outcome {
    int i = -1;
    std::vector<std::string> missing;
  };
  std::vector<outcome> timed_out, woken;
  std::vector<clock::time_point> before(n), after(n); // around each registration: bounds of its deadline
  std::vector<std::chrono::milliseconds> timeout(n);
  int left = 0, woken_expected = 0;
  for (int i = 0; i < n; ++i) {
    const bool times_out = i % 2 == 0;
    const bool leaves = !times_out && i % 50 == 1;
    const bool two_keys = !times_out && !leaves && i % 10 == 3;
    std::vector<std::string> keys;
    if (times_out)
      keys = {"gone/" + std::to_string(i)};
    else if (two_keys)
      keys = {"barrier", "second"};
    else
      keys = {"barrier"};
    timeout[i] = times_out ? std::chrono::milliseconds(30 + (i / 2 * 379) % 1000) // scrambled
                           : std::chrono::milliseconds(20'000 + i);
    const cs::detail::engine::owner_id owner = leaves ? 5 : static_cast<cs::detail::engine::owner_id>(i % 4 + 1);
    left += leaves;
    woken_expected += !times_out && !leaves;
    before[i] = clock::now();
    eng->wait(std::move(keys), timeout[i], owner,
              [&, i](std::vector<std::string>&&, std::vector<std::string>&& missing) {
                (missing.empty() ? woken : timed_out).push_back({i, std::move(missing)});
              });
    after[i] = clock::now();
  }
  BOOST_TEST(eng->pending_waits() == std::size_t(n));
  eng->drop_owner(5);
  BOOST_TEST(eng->pending_waits() == std::size_t(n - left));

  while (timed_out.size() < n / 2u)
    ctx.run_one();
  BOOST_TEST(woken.empty());
  for (std::size_t k = 0; k < timed_out.size(); ++k) {
    const auto i = timed_out[k].i;
    BOOST_TEST_REQUIRE(i % 2 == 0);
    BOOST_TEST((timed_out[k].missing == std::vector<std::string>{"gone/" + std::to_string(i)}));
    if (k > 0) { // the previous one's deadline is no later than this one's
      const auto p = timed_out[k - 1].i;
      BOOST_TEST((before[p] + timeout[p] <= after[i] + timeout[i]), "wait " << p << " timed out before " << i);
    }
  }
  BOOST_TEST(eng->pending_waits() == std::size_t(woken_expected));

  eng->set("barrier", "open");
  BOOST_TEST(woken.size() == std::size_t(woken_expected - (n / 10)));
  eng->set("second", "too");
  BOOST_TEST(woken.size() == std::size_t(woken_expected));
  for (auto& w : woken)
    BOOST_TEST((w.i % 2 == 1 && w.i % 50 != 1), "wait " << w.i);
  BOOST_TEST(timed_out.size() == n / 2u); // none of the woken timed out as well
  BOOST_TEST(eng->pending_waits() == 0u);
  BOOST_TEST(eng->wait_bytes() == 0u);
  ctx.run(); // returns: no timer left armed for the woken waits' deadlines
  BOOST_TEST(timed_out.size() == n / 2u);
}

// A wait whose deadline is the earliest arrives after later ones: the one
// timer is re-armed for it; one that leaves before its deadline never fires.
BOOST_AUTO_TEST_CASE(an_earlier_deadline_rearms_the_timer, *utf::timeout(30)) {
  asio::io_context ctx;
  auto eng = std::make_shared<cs::detail::engine>(ctx.get_executor());
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&order, name](std::vector<std::string>&&, std::vector<std::string>&& missing) {
      order.push_back(name + (missing.empty() ? " woken" : " timed out"));
    };
  };
  eng->wait({"a"}, 20'000ms, 1, record("late"));
  eng->wait({"b"}, 40ms, 1, record("early"));
  eng->wait({"c"}, 30ms, 2, record("gone"));
  eng->drop_owner(2);
  eng->wait({"d"}, 0ms, 1, record("never")); // no deadline
  while (order.empty())
    ctx.run_one();
  BOOST_TEST((order == std::vector<std::string>{"early timed out"}));
  eng->set("a", "1");
  eng->set("d", "1");
  BOOST_TEST((order == std::vector<std::string>{"early timed out", "late woken", "never woken"}));
  ctx.run();
  BOOST_TEST(order.size() == 3u);
}

// Thousands of long waits due together warn in one line per log, timeout and
// key set, counting them; a later round warns only about the waits then due.
// (Warnings after 0 ms: every wait registered before the loop runs is due at
// its first round, whatever the clock; the next round after an hour.)
BOOST_AUTO_TEST_CASE(waits_due_together_warn_in_one_counted_line, *utf::timeout(30)) {
  corodist::test::log_capture log;
  corodist::test::warning_schedule_for_test schedule(0ms, std::chrono::hours(1));
  asio::io_context ctx; // run by this thread only, after the entries are made
  cs::detail::wait_log here(ctx.get_executor(), "somewhere:2");
  cs::detail::wait_log there(ctx.get_executor(), "elsewhere:3");
  const std::vector<std::string> barrier{"rdzv/done"};
  const std::vector<std::string> solo{"z"};
  std::vector<std::vector<std::string>> pairs(7, std::vector<std::string>{"x", "y"}); // equal keys, distinct spans
  std::vector<std::unique_ptr<cs::detail::wait_log::entry>> entries;
  using entry = cs::detail::wait_log::entry;
  for (int i = 0; i < 3000; ++i)
    entries.push_back(std::make_unique<entry>(here, barrier, 0ms));
  for (int i = 0; i < 500; ++i)
    entries.push_back(std::make_unique<entry>(here, barrier, 60'000ms));
  for (int i = 0; i < 200; ++i)
    entries.push_back(std::make_unique<entry>(there, barrier, 0ms));
  entries.push_back(std::make_unique<entry>(here, solo, 0ms));
  for (auto& p : pairs)
    entries.push_back(std::make_unique<entry>(here, p, 0ms));

  while (log.lines("still waiting for").size() < 4)
    ctx.run_one();
  auto lines = log.lines("still waiting for");
  BOOST_TEST_REQUIRE(lines.size() == 4u);
  auto one = [&](const std::string& text) {
    return std::count_if(lines.begin(), lines.end(), [&](auto& l) { return contains(l, text); });
  };
  // Waits with and without a deadline share the line of their keys.
  BOOST_TEST(one("store: 3500 waits still waiting for key rdzv/done at somewhere:2 after") == 1);
  BOOST_TEST(one("(gives up after 60 s, some never)") == 1);
  BOOST_TEST(one("store: 200 waits still waiting for key rdzv/done at elsewhere:3 after") == 1);
  BOOST_TEST(one("store: still waiting for key z at somewhere:2 after") == 1);
  BOOST_TEST(one("store: 7 waits still waiting for keys x, y at somewhere:2 after") == 1);
  BOOST_TEST(one("(no deadline)") == 3);

  // Half of them go (scattered through the index), a hundred new ones come:
  // the next round warns about the new ones alone (the others are due in an hour).
  for (std::size_t i = 0; i < entries.size(); i += 2)
    entries[i].reset();
  for (int i = 0; i < 100; ++i)
    entries.push_back(std::make_unique<entry>(there, solo, 0ms));
  while (log.lines("still waiting for").size() < 5)
    ctx.run_one();
  lines = log.lines("still waiting for");
  BOOST_TEST_REQUIRE(lines.size() == 5u);
  BOOST_TEST(contains(lines.back(), "store: 100 waits still waiting for key z at elsewhere:3 after"), lines.back());

  // The waits of different stores for the same keys at the same place warn
  // in one line: ranks of one process, each with its own store.
  cs::detail::wait_log a(ctx.get_executor(), "server:4"), b(ctx.get_executor(), "server:4");
  const std::vector<std::string> go{"go"};
  entries.push_back(std::make_unique<entry>(a, go, 0ms));
  entries.push_back(std::make_unique<entry>(b, go, 0ms));
  while (log.lines("still waiting for").size() < 6)
    ctx.run_one();
  lines = log.lines("still waiting for");
  BOOST_TEST_REQUIRE(lines.size() == 6u);
  BOOST_TEST(contains(lines.back(), "store: 2 waits still waiting for key go at server:4 after"), lines.back());

  entries.clear();
  ctx.run(); // returns: with no wait left, no warning is armed
  BOOST_TEST(log.lines("still waiting for").size() == 6u);
}
