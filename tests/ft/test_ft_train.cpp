// examples/ft_train.cpp as a job: four replica processes train against a
// store_server of the test's (in the launcher's place); one is killed or
// hung mid-run, the others go on at three, it is restarted, rejoins and
// catches up; at the end every replica's weights and momentum are bit-equal,
// and equal to a replay of the committed steps in one process.
#include <boost/test/unit_test.hpp>

#include "support/program.hpp"
#include "support/temp_file.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/store/store_server.hpp>

#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace cs = corodist::store;
using corodist::test::program;
using namespace std::chrono_literals;

namespace {

constexpr int replicas = 4;
constexpr int steps = 40;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// The "committed <step> <members>" lines of an output, by step.
std::map<int, std::string> committed(const std::string& output) {
  std::map<int, std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string word, members;
    int step = -1;
    if (l >> word >> step >> members && word == "committed") out[step] = members;
  }
  return out;
}

struct job {
  corodist::event_loop loop;
  std::shared_ptr<cs::store_server> server;
  std::vector<corodist::test::temp_file> outs = std::vector<corodist::test::temp_file>(replicas);
  std::vector<std::unique_ptr<program>> ps;
  std::vector<std::string> done_output = std::vector<std::string>(replicas);

  job() {
    loop.start();
    cs::server_options so;
    so.host = "127.0.0.1";
    so.port = 0;
    server = cs::store_server::start(loop.get_executor(), so);
  }
  ~job() {
    ps.clear();
    server->stop();
  }

  std::unique_ptr<program> start(int i) {
    std::vector<std::string> argv{CORODIST_FT_TRAIN_PATH, "--replica", "r" + std::to_string(i), "--steps",
                                  std::to_string(steps), "--min-replicas", "3", "--step-ms", "20", "--out",
                                  outs[i].path};
    std::vector<std::pair<std::string, std::string>> env{
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(server->local_endpoint().port())},
        {"CORODIST_PEER_TIMEOUT_MS", "1000"}};
    return std::make_unique<program>(argv, env);
  }

  /// Reads replica i's output until a line starts with `prefix`.
  void await_line(int i, const std::string& prefix) {
    for (;;) {
      auto line = ps[i]->read_line(60s);
      BOOST_REQUIRE_MESSAGE(line, "replica " << i << " never printed '" << prefix << "': " << ps[i]->output());
      if (line->rfind(prefix, 0) == 0) return;
    }
  }

  void finish() {
    for (int i = 0; i < replicas; ++i) {
      int status = ps[i]->wait(120s);
      BOOST_TEST_INFO("replica " << i << " output:\n" << ps[i]->output());
      BOOST_TEST(status == 0);
      done_output[i] = ps[i]->output();
    }
  }

  void check_equal_and_replayed() {
    auto first = slurp(outs[0].path);
    BOOST_REQUIRE(first.size() == 2 * 64 * sizeof(float));
    for (int i = 1; i < replicas; ++i) BOOST_TEST(slurp(outs[i].path) == first, "replica " << i << " differs");
    corodist::test::temp_file log, replayed;
    std::ofstream(log.path) << done_output[0];
    program r({CORODIST_FT_TRAIN_PATH, "--replay", log.path, "--out", replayed.path});
    BOOST_TEST_REQUIRE(r.wait(60s) == 0, r.output());
    BOOST_TEST(slurp(replayed.path) == first, "the replay differs");
  }
};

} // namespace

BOOST_AUTO_TEST_SUITE(ft_train)

BOOST_AUTO_TEST_CASE(a_killed_replica_rejoins_and_all_end_bit_equal) {
  job j;
  for (int i = 0; i < replicas; ++i) j.ps.push_back(j.start(i));
  j.await_line(2, "committed 10 ");
  ::kill(j.ps[2]->pid(), SIGKILL);
  BOOST_TEST(j.ps[2]->wait(30s) == -1);
  // The others go on at three before it is back.
  j.await_line(0, "quorum ");
  j.ps[2] = j.start(2);
  j.await_line(2, "quorum ");
  j.finish();
  auto steps0 = committed(j.done_output[0]);
  BOOST_TEST(steps0.size() == static_cast<std::size_t>(steps));
  BOOST_TEST(steps0.rbegin()->first == steps - 1);
  int at_three = 0;
  for (auto& [s, members] : steps0) at_three += members.find("r2") == std::string::npos;
  BOOST_TEST(at_three > 0);
  BOOST_TEST(steps0.rbegin()->second == "r0,r1,r2,r3");
  BOOST_TEST(j.done_output[2].find("recovered") != std::string::npos);
  // The restarted replica committed only steps after it came back.
  auto steps2 = committed(j.done_output[2]);
  BOOST_TEST(!steps2.empty());
  BOOST_TEST(steps2.begin()->first > 10);
  j.check_equal_and_replayed();
}

BOOST_AUTO_TEST_CASE(a_hung_replica_is_left_behind_and_restarted) {
  job j;
  for (int i = 0; i < replicas; ++i) j.ps.push_back(j.start(i));
  j.await_line(1, "committed 5 ");
  ::kill(j.ps[1]->pid(), SIGSTOP);
  j.await_line(0, "quorum "); // the others found it lost (heartbeat deadline) and went on
  ::kill(j.ps[1]->pid(), SIGCONT);
  // Its store connection was closed meanwhile: it fails, and is restarted.
  BOOST_TEST(j.ps[1]->wait(60s) != 0);
  j.ps[1] = j.start(1);
  j.finish();
  BOOST_TEST(j.done_output[1].find("recovered") != std::string::npos);
  j.check_equal_and_replayed();
}

BOOST_AUTO_TEST_SUITE_END()
