// Randomized faults against a job of ft_train replicas on a host bed
// (tests/ft/ft_job.hpp, tests/support/host_bed.hpp): each run picks a fault
// kind, a replica (r0 included; the store's host, the launcher's place, is
// never hit) and a moment (after a random committed step), injects it,
// restarts the replica when it was lost, and checks that the job ends: every
// replica exits 0, all end bit-equal and equal to the replay of the committed
// steps, and every replica saw the same members for each step it committed.
//
//   CORODIST_FT_RUNS       runs of random_faults (default 30)
//   CORODIST_FT_SEED_BASE  the first run's seed (default: drawn, and printed)
//   CORODIST_FT_SEED=S build/tests/test_ft_random --run_test=ft_random/replay   replays one run
#define BOOST_TEST_MODULE ft_random
#include <boost/test/results_collector.hpp>
#include <boost/test/unit_test.hpp>

#include "ft/ft_job.hpp"

#include <cstdlib>
#include <random>
#include <string>
#include <thread>

using corodist::test::direction;
using corodist::test::ft_job;
using corodist::test::host_bed;

namespace {

constexpr int replicas = 4, steps = 30, step_ms = 10;
constexpr const char* kinds[] = {"kill9", "sigstop_long", "sigstop_short", "link_down", "block_out", "block_in"};

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoull(v) : fallback;
}

/// One run with seed `seed` on `bed`; true when every check held.
bool run_once(host_bed& bed, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string kind = kinds[rng() % std::size(kinds)];
  const int victim = static_cast<int>(rng() % replicas);
  const int after = 2 + static_cast<int>(rng() % 12);
  const int witness = (victim + 1 + static_cast<int>(rng() % (replicas - 1))) % replicas;
  BOOST_TEST_MESSAGE("ft_random: seed " << seed << ": " << kind << " of r" << victim << " after step " << after);
  const auto failures = boost::unit_test::results_collector.results(
                            boost::unit_test::framework::current_test_case().p_id).p_assertions_failed.get();

  ft_job job(bed, replicas, steps, step_ms);
  // The victim waits after step `after` until its fault is in place (a
  // network fault takes nft or ip some time; the job must not end first).
  job.hold(victim, after);
  job.start_all();
  job.await_line(victim, "committed " + std::to_string(after) + " ");
  const pid_t pid = job.ps[victim]->pid();
  const int host = job.host_of(victim);
  const std::string lost = " left r" + std::to_string(victim);
  bool restart = true;
  // Signals hit the victim just after it goes on (in its next step); a
  // network fault is in place before it does.
  if (kind == "kill9") {
    job.release();
    host_bed::kill9(pid);
  } else if (kind == "sigstop_long") {
    job.release();
    host_bed::stop(pid);
    job.await_line(witness, "quorum ", lost);
    host_bed::cont(pid);
  } else if (kind == "sigstop_short") {
    // A pause shorter than the heartbeat deadline (1 s): the replica is not lost.
    job.release();
    host_bed::stop(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the fault's length, not a wait for an event
    host_bed::cont(pid);
    restart = false;
  } else if (kind == "link_down") {
    bed.link_down(host);
    job.release();
    job.await_line(witness, "quorum ", lost);
    bed.link_up(host);
  } else {
    const auto d = kind == "block_out" ? direction::out : direction::in;
    bed.block(host, d);
    job.release();
    job.await_line(witness, "quorum ", lost);
    bed.unblock(host, d);
  }
  if (restart) {
    // Killed, or found its store connection closed: it ends; then it comes back.
    job.ps[victim]->wait(std::chrono::seconds(60));
    job.start(victim);
  }
  if (job.finish())
    job.check_equal_and_replayed(witness);
  const auto now = boost::unit_test::results_collector.results(
                       boost::unit_test::framework::current_test_case().p_id).p_assertions_failed.get();
  if (now != failures) {
    BOOST_TEST_MESSAGE("ft_random: run failed; replay it with: CORODIST_FT_SEED="
                       << seed << " build/tests/test_ft_random --run_test=ft_random/replay");
    return false;
  }
  return true;
}

} // namespace

BOOST_AUTO_TEST_SUITE(ft_random, *boost::unit_test::precondition(host_bed::available))

BOOST_AUTO_TEST_CASE(random_faults) {
  const auto runs = env_number("CORODIST_FT_RUNS", 30);
  const auto base = env_number("CORODIST_FT_SEED_BASE", std::random_device{}());
  BOOST_TEST_MESSAGE("ft_random: " << runs << " runs from seed " << base);
  host_bed bed(replicas + 1);
  int failed = 0;
  for (std::uint64_t i = 0; i < runs; ++i) failed += !run_once(bed, base + i);
  BOOST_TEST(failed == 0);
}

BOOST_AUTO_TEST_CASE(replay) {
  const char* seed = std::getenv("CORODIST_FT_SEED");
  if (!seed) {
    BOOST_TEST_MESSAGE("ft_random/replay: set CORODIST_FT_SEED to replay a run");
    return;
  }
  host_bed bed(replicas + 1);
  BOOST_TEST(run_once(bed, std::stoull(seed)));
}

BOOST_AUTO_TEST_SUITE_END()
