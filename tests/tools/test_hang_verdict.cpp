// The hang verdict, live, from corodist-run: real ranks (corodist-test-hang)
// on real Gloo groups and RPC agents hang in the ways jobs hang, and the
// launcher's hang watch must name who is behind and where, and write every
// rank's flight recorder to a file, within a bound of --hang-after.
#define BOOST_TEST_MODULE hang_verdict
#include <boost/test/unit_test.hpp>

#include "support/launched.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string launcher_path = CORODIST_RUN_PATH;
const std::string hang_path = CORODIST_TEST_HANG_PATH;

/// The verdict's bound past --hang-after: the stuck scan (1 s), the watch's
/// wake-up, the gathering (at most 5 s) — with room for a loaded machine.
constexpr auto verdict_bound = 30s;
constexpr auto hang_after_s = 2;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// One scenario under corodist-run with a dump directory of its own.
struct scenario {
  scenario(const std::string& mode, int nproc)
      : dir(std::filesystem::temp_directory_path() / ("corodist-hang-" + mode + "-" + std::to_string(::getpid()))),
        run(launcher_path, {"--nproc", std::to_string(nproc), "--hang-after", std::to_string(hang_after_s),
                            "--hang-dump-dir", dir.string(), "--grace-period", "1", "--", hang_path, mode}) {}
  ~scenario() {
    ::kill(run.pid(), SIGTERM);
    run.finish(30s);
    std::filesystem::remove_all(dir);
  }

  /// Waits for a verdict (`marker` ends it: the dumps' line); true when it came within the bound.
  bool verdict(const std::string& marker = "every rank's flight recorder:") {
    const auto t0 = clock_type::now();
    const bool came = run.wait_for_lines(marker, 1, std::chrono::seconds(hang_after_s) + verdict_bound + 30s, true);
    took = clock_type::now() - t0;
    BOOST_TEST_MESSAGE("verdict after " << std::chrono::duration<double>(took).count() << " s:\n" << run.err());
    return came;
  }

  /// The JSON file the verdict names.
  nlohmann::json dumps() const {
    const auto& e = run.err();
    const auto at = e.find("every rank's flight recorder: ");
    BOOST_REQUIRE(at != std::string::npos);
    const auto start = at + std::string("every rank's flight recorder: ").size();
    const auto path = e.substr(start, e.find('\n', start) - start);
    std::ifstream in(path);
    return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  }

  std::filesystem::path dir;
  corodist::test::launched run;
  clock_type::duration took{};
};

} // namespace

// A rank skipped one same-shaped allreduce: its next one paired with the
// others' #1; they wait in #2, it computes. (A group numbers its collectives from 0.)
BOOST_AUTO_TEST_CASE(a_rank_that_skips_a_collective, *utf::timeout(120)) {
  scenario s("skip", 3);
  BOOST_REQUIRE(s.verdict());
  BOOST_TEST(s.took < std::chrono::seconds(hang_after_s) + verdict_bound);
  const auto& e = s.run.err();
  BOOST_TEST(contains(e, "ranks 0,1 wait in allreduce #2 (float32 x 1000, sum) on group 'corodist/pg' at hang_rank.cpp:"));
  BOOST_TEST(contains(e, "not arrived: rank 2"));
  BOOST_TEST(contains(e, "rank 2 completed #1 of group"));
  BOOST_TEST(contains(e, "and is in no collective (last: allreduce #1"));
  const auto d = s.dumps();
  BOOST_TEST(d["ranks"].size() == 3u);
  for (const auto& r : d["ranks"])
    BOOST_TEST(r["dump"].is_object());
}

// A rank stuck in its own compute: the others wait for it in #1.
BOOST_AUTO_TEST_CASE(a_rank_stuck_in_its_own_compute, *utf::timeout(120)) {
  scenario s("compute", 3);
  BOOST_REQUIRE(s.verdict());
  BOOST_TEST(s.took < std::chrono::seconds(hang_after_s) + verdict_bound);
  const auto& e = s.run.err();
  BOOST_TEST(contains(e, "ranks 0,1 wait in allreduce #1"));
  BOOST_TEST(contains(e, "not arrived: rank 2"));
  BOOST_TEST(contains(e, "rank 2 completed #0 of group"));
  BOOST_TEST(contains(e, "is in no collective"));
}

// A rank hangs in an RPC call to a worker that stopped answering (SIGSTOP);
// the others wait for it in a collective; the stopped worker cannot answer.
BOOST_AUTO_TEST_CASE(a_rank_hung_in_a_call_to_a_dead_worker, *utf::timeout(120)) {
  scenario s("dead-rpc", 3);
  BOOST_REQUIRE(s.verdict());
  BOOST_TEST(s.took < std::chrono::seconds(hang_after_s) + verdict_bound);
  const auto& e = s.run.err();
  BOOST_TEST(contains(e, "rank 2 waits in allreduce #1"));
  BOOST_TEST(contains(e, "rank 0 completed #0 of group"));
  BOOST_TEST(contains(e, "waits in call 'load' to 'w1' since"));
  BOOST_TEST(contains(e, "rank 1 did not answer"));
}

// A rank died while the others waited for it.
BOOST_AUTO_TEST_CASE(a_rank_that_died, *utf::timeout(120)) {
  scenario s("died", 3);
  BOOST_REQUIRE(s.verdict("corodist-failure-gen0-rank2.json"));
  BOOST_TEST(s.took < std::chrono::seconds(hang_after_s) + verdict_bound);
  const auto& e = s.run.err();
  BOOST_TEST(contains(e, "verdict when rank 2 failed:"));
  BOOST_TEST(contains(e, "rank 2 did not answer: it failed: killed by"));
  // The survivors wait in #1, or have seen it fail with rank 2's loss.
  BOOST_TEST((contains(e, "ranks 0,1 wait in allreduce #1") ||
              (contains(e, "rank 0: allreduce #1") && contains(e, "rank 1: allreduce #1"))));
}

// Two groups called in different orders on two ranks: a deadlock across groups.
BOOST_AUTO_TEST_CASE(two_groups_interleaved_in_different_orders, *utf::timeout(120)) {
  scenario s("cross", 2);
  BOOST_REQUIRE(s.verdict());
  BOOST_TEST(s.took < std::chrono::seconds(hang_after_s) + verdict_bound);
  const auto& e = s.run.err();
  BOOST_TEST(contains(e, "rank 0 waits in allreduce #0 (float32 x 1000, sum) on group 'a'"));
  BOOST_TEST(contains(e, "rank 1 waits in allreduce #0 (float32 x 1000, sum) on group 'b'"));
  BOOST_TEST(contains(e, "deadlock: rank 0 waits in"));
}
