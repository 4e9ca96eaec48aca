// What a gloo_group tells about a job that goes wrong: its flight recorder's
// entries, the call check's call sites (a rank that skipped a collective is
// caught at the call), and a timeout that names the ranks not in the
// collective and dumps the recorders. Ranks are threads of this process over
// one in-memory store.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/store/sync_store.hpp>

#include <corodist/store/debug_responder.hpp>

#include "collective/gloo_fixtures.hpp"
#include "store/log_capture.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
using corodist::test::gloo_test_options;
using corodist::test::require_all_ok;
using corodist::test::require_throws;
using corodist::test::thread_ranks;
using corodist::test::child_process;

namespace {

const std::string this_file = "test_gloo_debugging.cpp";

/// "test_gloo_debugging.cpp:42".
std::string site(int line) { return this_file + ":" + std::to_string(line); }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The entries of every live recorder of layer "collective" named `name`.
std::vector<nlohmann::json> recorders_named(const nlohmann::json& doc, const std::string& name) {
  std::vector<nlohmann::json> found;
  for (const auto& r : doc.at("recorders"))
    if (r.at("layer") == "collective" && r.at("name") == name)
      found.push_back(r.at("entries"));
  return found;
}

/// The entry of `entries` with op `op` and seq `seq`, or null.
const nlohmann::json* entry(const nlohmann::json& entries, const std::string& op, std::uint64_t seq) {
  for (const auto& e : entries)
    if (e.at("op") == op && e.at("seq") == seq)
      return &e;
  return nullptr;
}

/// Waits until `key` holds a value starting with `want` (the store's events,
/// no polling); throws after `timeout`.
void wait_for_prefix(corodist::store::sync_store& s, const std::string& key, const std::string& want,
                     std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto changes = s.watch_key(key);
  std::vector<std::string> keys{key};
  if (s.check(keys) && s.get(key).starts_with(want))
    return;
  while (!s.next(changes, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                                 std::chrono::steady_clock::now()))
              .value.starts_with(want)) {
  }
}

/// Sets an environment variable for a test's duration (the test's threads read it).
struct scoped_env {
  scoped_env(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~scoped_env() { ::unsetenv(name_); }
  const char* name_;
};

} // namespace

BOOST_AUTO_TEST_SUITE(gloo_debugging, *utf::precondition(corodist::test::gloo_built))

// Every collective and point-to-point call is in the group's recorder (named
// by its prefix on every rank): its number, kind, shape, peers, call site,
// bytes and state; a mismatch is recorded as failed with its text and kind.
BOOST_AUTO_TEST_CASE(the_recorder_lists_each_call_with_its_shape_site_and_state, *utf::timeout(60)) {
  thread_ranks job;
  int allreduce_line = 0;
  std::vector<std::shared_ptr<cc::gloo_group>> groups(2); // their recorders live as long as they do
  require_all_ok(job.run(2, [&](int r) {
    auto opts = gloo_test_options("dbg/rec");
    opts.check_calls = true;
    auto pg = groups[static_cast<std::size_t>(r)] = job.group(r, 2, opts);
    std::vector<float> v(1000, 1.0f);
    pg->allreduce(v).get(); allreduce_line = __LINE__;
    std::vector<std::int64_t> p(4, r);
    (r == 0 ? pg->send(p, 1) : pg->recv(p, 0)).get();
    std::vector<float> odd(r == 0 ? 1000 : 999, 1.0f);
    require_throws<cc::collective_error>([&] { pg->allreduce(odd).get(); }, "sizes differ");
  }));
  if (!corodist::flight_recorder::enabled())
    return; // CORODIST_RECORDER=0: nothing recorded (the groups above worked without)
  const auto doc = nlohmann::json::parse(corodist::dump_flight_recorders());
  const auto found = recorders_named(doc, "dbg/rec");
  BOOST_TEST_REQUIRE(found.size() == 2u); // one per rank, the same name
  int sends = 0, recvs = 0;
  for (const auto& entries : found) {
    const auto* first = entry(entries, "allreduce", 0);
    BOOST_TEST_REQUIRE(first != nullptr);
    BOOST_TEST((*first)["detail"] == "float32 x 1000, sum");
    BOOST_TEST((*first)["peer"] == "ranks 0-1");
    BOOST_TEST((*first)["where"] == site(allreduce_line));
    BOOST_TEST((*first)["bytes"] == 4000);
    BOOST_TEST((*first)["state"] == "completed");
    BOOST_TEST((*first)["started_ns"].get<std::int64_t>() > 0);

    const auto* sent = entry(entries, "send", 0);
    const auto* received = entry(entries, "recv", 0);
    BOOST_TEST_REQUIRE((sent != nullptr) != (received != nullptr));
    const auto& p2p = sent ? *sent : *received;
    BOOST_TEST(p2p["peer"] == (sent ? "rank 1" : "rank 0"));
    BOOST_TEST(p2p["detail"] == (sent ? "send(int64 x 4 to rank 1, tag 0)" : "recv(int64 x 4 from rank 0, tag 0)"));
    BOOST_TEST(p2p["state"] == "completed");
    BOOST_TEST(p2p["bytes"] == 32);
    sends += sent != nullptr;
    recvs += received != nullptr;

    const auto* mismatch = entry(entries, "allreduce", 1);
    BOOST_TEST_REQUIRE(mismatch != nullptr);
    BOOST_TEST((*mismatch)["state"] == "failed");
    BOOST_TEST((*mismatch)["error_type"] == "mismatch");
    BOOST_TEST(has((*mismatch)["error"].get<std::string>(), "the ranks' calls differ"));
  }
  BOOST_TEST(sends == 1);
  BOOST_TEST(recvs == 1);
}

// The case with the call check on: rank 1 skips the first of two
// same-shaped allreduces made from two lines. Its next allreduce pairs with
// the others' skipped one: every rank's call fails at once (no timeout, no
// abort) naming both ranks' collective numbers and call sites; the buffers
// are untouched and the group stays usable.
BOOST_AUTO_TEST_CASE(a_rank_that_skipped_an_allreduce_is_caught_at_the_call, *utf::timeout(60)) {
  thread_ranks job;
  // The two lines (A, B) the allreduces are made from.
  const auto first = [](cc::gloo_group& g, std::vector<float>& v) { return g.allreduce(v); }; const int line_a = __LINE__;
  const auto second = [](cc::gloo_group& g, std::vector<float>& v) { return g.allreduce(v); }; const int line_b = __LINE__;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options("dbg/skip");
    opts.check_calls = true;
    auto pg = job.group(r, 3, opts);
    std::vector<float> v(4, 1.0f);
    std::string msg;
    if (r != 1)
      msg = require_throws<cc::collective_error>([&] { first(*pg, v).get(); }, "the first allreduce");
    else
      msg = require_throws<cc::collective_error>([&] { second(*pg, v).get(); }, "rank 1's only allreduce");
    RANK_REQUIRE(has(msg, "allreduce #0 on rank " + std::to_string(r)));
    RANK_REQUIRE(has(msg, "rank 1 called allreduce #0 (float32 x 4, sum) at " + site(line_b)));
    RANK_REQUIRE(has(msg, "called allreduce #0 (float32 x 4, sum) at " + site(line_a)));
    RANK_REQUIRE(v[0] == 1.0f && v[3] == 1.0f); // no data moved
    RANK_REQUIRE(!pg->aborted());
    // Rank 1 calls again from line B (its collective #1), as the others do now.
    second(*pg, v).get();
    RANK_REQUIRE(v[0] == 3.0f && v[3] == 3.0f);
  }));
}

// The same line on every rank raises nothing: a defaulted or braced
// call_options (the call's line), a named one (the header's line on every
// rank), and one line with a call in each branch. With compare_call_sites off,
// calls from different lines are compared by shape only.
BOOST_AUTO_TEST_CASE(calls_from_the_same_line_or_without_site_comparison_pass, *utf::timeout(60)) {
  thread_ranks job;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options("dbg/same");
    opts.check_calls = true;
    auto pg = job.group(r, 3, opts);
    std::vector<float> v(10, 1.0f);
    pg->allreduce(v).get();
    pg->allreduce(v, cc::reduce_op::sum, {.timeout = 10s}).get();
    cc::call_options named;
    named.timeout = 10s;
    if (r == 0)
      pg->allreduce(v, cc::reduce_op::sum, named).get();
    else
      pg->allreduce(v, cc::reduce_op::sum, named).get();
    (r == 0 ? pg->allreduce(v) : pg->allreduce(v)).get();
    RANK_REQUIRE(v[0] == 81.0f);

    auto loose = gloo_test_options("dbg/loose");
    loose.check_calls = true;
    loose.compare_call_sites = false;
    auto lg = job.group(r, 3, loose);
    std::vector<float> w(10, 1.0f);
    if (r == 0)
      lg->allreduce(w).get();
    else
      lg->allreduce(w).get();
    RANK_REQUIRE(w[0] == 3.0f);
    std::vector<float> odd(r == 2 ? 9 : 10, 1.0f); // shapes are still compared
    auto msg = require_throws<cc::collective_error>([&] { lg->allreduce(odd).get(); }, "sizes differ");
    RANK_REQUIRE(has(msg, "rank 2 called allreduce #1 (float32 x 9, sum)"));
  }));
}

// A rank that never calls: at the deadline the collective_timeout_error names
// it ("rank 2 is not in allreduce #1 (last seen waiting in #0)") from the
// stall probe's waiting keys, and not the rank that waits in it too; the
// flight recorders are dumped once.
BOOST_AUTO_TEST_CASE(a_timeout_names_the_ranks_not_in_the_collective, *utf::timeout(90)) {
  thread_ranks job;
  const auto dir = std::filesystem::temp_directory_path() / ("corodist-dbg-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  scoped_env dump_dir("CORODIST_RECORDER_DUMP_DIR", dir.string());
  corodist::test::countdown rank0_done(1);
  std::string rank0_error;
  require_all_ok(job.run(3, [&](int r) {
    auto opts = gloo_test_options("dbg/late");
    opts.mismatch_probe_delay = 50ms; // a stalled rank publishes its waiting key after 50 ms
    auto pg = job.group(r, 3, opts);
    corodist::store::sync_store s(job.store);
    std::vector<float> v(100, 1.0f);
    // #0: rank 2 first; the others join once it has been seen waiting.
    if (r != 2)
      s.wait({"dbg/late/waiting/2"}, 20s);
    pg->allreduce(v).get();
    if (r == 2) { // never calls #1; keeps its group until rank 0 has timed out
      RANK_REQUIRE(rank0_done.wait_for(60s));
      return;
    }
    if (r == 1) { // waits in #1 until rank 0's abort ends it
      require_throws<cc::collective_failure>([&] { pg->allreduce(v).get(); }, "rank 1's allreduce #1");
      return;
    }
    wait_for_prefix(s, "dbg/late/waiting/1", "collective #1:", 20s); // rank 1 is seen waiting in #1
    rank0_error = require_throws<cc::collective_timeout_error>(
        [&] { pg->allreduce(v, cc::reduce_op::sum, {.timeout = 1500ms}).get(); }, "rank 0's allreduce #1");
    rank0_done.arrive();
  }));
  BOOST_TEST_INFO("rank 0's error: " << rank0_error);
  BOOST_TEST(has(rank0_error, "allreduce #1 on rank 0 of 3"));
  BOOST_TEST(has(rank0_error, "timed out after 1500 ms"));
  BOOST_TEST(has(rank0_error, "rank 2 is not in allreduce #1 (last seen waiting in #0)"));
  BOOST_TEST(!has(rank0_error, "rank 1 is not in"));
  if (!corodist::flight_recorder::enabled())
    return;
  const auto dump = dir / ("corodist-recorder-" + std::to_string(::getpid()) + ".json");
  BOOST_TEST_REQUIRE(std::filesystem::exists(dump), dump.string() << " was not written");
  std::ifstream in(dump);
  const auto doc = nlohmann::json::parse(in);
  bool waiting = false; // rank 0's #1, still waiting when the dump was taken
  for (const auto& entries : recorders_named(doc, "dbg/late"))
    if (const auto* e = entry(entries, "allreduce", 1))
      waiting = waiting || (*e)["state"] == "started";
  BOOST_TEST(waiting);
  std::filesystem::remove_all(dir);
}

// A collective that waits past mismatch_probe_delay warns (and again at
// growing intervals). Without a debug responder in the process, the warning
// names the collective and says that corodist-run's verdict names the ranks.
BOOST_AUTO_TEST_CASE(a_waiting_collective_warns_without_a_responder, *utf::timeout(60)) {
  corodist::test::log_capture log; // before any thread logs
  thread_ranks job;
  const std::string warned = "on group 'dbg/warn' has waited";
  require_all_ok(job.run(2, [&](int r) {
    auto opts = gloo_test_options("dbg/warn");
    opts.mismatch_probe_delay = 50ms;
    auto pg = job.group(r, 2, opts);
    std::vector<float> v(10, 1.0f);
    if (r == 1) // joins once rank 0 has warned
      RANK_REQUIRE(!log.wait_for(warned, 1, 20s).empty());
    pg->allreduce(v).get();
    RANK_REQUIRE(v[0] == 2.0f);
  }));
  const auto lines = log.lines(warned);
  BOOST_TEST_REQUIRE(!lines.empty());
  BOOST_TEST_INFO("warning: " << lines[0]);
  BOOST_TEST(has(lines[0], "rank 0: allreduce #0 (float32 x 10, sum) " + warned));
  BOOST_TEST(has(lines[0], "(no debug responder in this process: the ranks are named by corodist-run's verdict)"));
}

namespace {

enum warn_code : int { warned_ok = 0, no_warning = 10, failed = 11 };

/// Rank `rank` of 3 processes with a debug responder each: ranks 0 and 1
/// wait in allreduce #0; rank 2 joins only once rank 0 has logged a warning
/// that names it as not arrived (from the ranks' recorders, gathered through
/// the responders).
int responder_rank(std::uint16_t port, int rank) {
  corodist::test::log_capture log; // before the loop's thread logs
  corodist::event_loop loop;
  loop.start();
  auto store = corodist::test::connect_test_store(loop, port);
  auto responder = corodist::store::debug_responder::start(store, rank, 3);
  auto opts = gloo_test_options("dbg/warnr");
  opts.mismatch_probe_delay = 50ms;
  auto pg = cc::gloo_group::create_sync(store, rank, 3, opts);
  corodist::store::sync_store s(store);
  std::vector<float> v(10, 1.0f);
  try {
    if (rank == 2) {
      s.wait({"dbg/test/warned"}, 30s);
      pg->allreduce(v).get();
    } else {
      auto w = pg->allreduce(v);
      if (rank == 0) {
        const auto lines = log.wait_for("not arrived: rank 2", 1, 30s);
        if (lines.empty() || !has(lines[0], "allreduce #0 (float32 x 10, sum) on group 'dbg/warnr' has waited")) {
          std::fprintf(stderr, "rank 0: no warning naming rank 2 (%zu lines)\n", lines.size());
          return no_warning;
        }
        std::fprintf(stderr, "rank 0 warned: %s\n", lines[0].c_str());
        s.set("dbg/test/warned", lines[0]);
      }
      w.get();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return failed;
  }
  responder->stop();
  return v[0] == 3.0f ? warned_ok : failed;
}

} // namespace

// With a debug responder in each rank process, the warning names the ranks
// not arrived ("not arrived: rank 2"), from every rank's flight recorders.
BOOST_AUTO_TEST_CASE(a_waiting_collective_names_the_ranks_not_arrived, *utf::timeout(120)) {
  corodist::test::tcp_impl host;
  const auto port = host.port();
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < 3; ++r)
    kids.push_back(std::make_unique<child_process>([=] { return responder_rank(port, r); }));
  for (int r = 0; r < 3; ++r) {
    const int code = kids[static_cast<std::size_t>(r)]->wait_for(90s);
    BOOST_TEST(code == static_cast<int>(warned_ok), "rank " << r << " ended with " << code);
  }
}

BOOST_AUTO_TEST_SUITE_END()
