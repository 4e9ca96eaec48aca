// corodist-run, the real binary, starting real rank processes
// (corodist-test-rank): environment, output prefixes, failure and signal
// handling, multi-node rank arithmetic with a real env:// rendezvous; and the
// Slurm fallback of env:// rendezvous with the variables set by hand.
#define BOOST_TEST_MODULE tools
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include "store/rendezvous/launch_env.hpp"
#include "subprocess.hpp"
#include "support/child_process.hpp"
#include "support/free_port.hpp"
#include "support/launched.hpp"
#include "support/test_certs.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
using clock_type = std::chrono::steady_clock;
using corodist::test::free_port;

namespace {

const std::string launcher_path = CORODIST_RUN_PATH;
const std::string rank_path = CORODIST_TEST_RANK_PATH;

/// corodist-run started with `args` (tests/support/launched.hpp).
class launched : public corodist::test::launched {
public:
  explicit launched(std::vector<std::string> args) : corodist::test::launched(launcher_path, std::move(args)) {}
};

/// "[R] rest" lines of `text` as (R, rest); lines without a prefix fail the test.
std::vector<std::pair<int, std::string>> prefixed(const std::string& text) {
  std::vector<std::pair<int, std::string>> v;
  for (auto& l : launched::lines(text)) {
    int rank = -1, used = 0;
    if (std::sscanf(l.c_str(), "[%d] %n", &rank, &used) == 1 && used > 0 && rank >= 0)
      v.emplace_back(rank, l.substr(static_cast<std::size_t>(used)));
    else
      BOOST_ERROR("line without a rank prefix: '" << l << "'");
  }
  return v;
}

/// A FIFO in a fresh temporary directory, removed at scope exit.
struct temp_fifo {
  temp_fifo() {
    char tmpl[] = "/tmp/corodist_run_XXXXXX";
    BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = dir + "/fifo";
    BOOST_REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  }
  ~temp_fifo() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
  std::string dir, path;
};

} // namespace

BOOST_AUTO_TEST_SUITE(launcher)

BOOST_AUTO_TEST_CASE(every_rank_gets_its_environment, *utf::timeout(60)) {
  launched l({"--nproc", "3", "--", rank_path, "env"});
  int st = l.finish();
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  std::set<int> ranks;
  std::set<int> ports;
  for (auto& [r, rest] : prefixed(l.out())) {
    int rank = -1, world = -1, local = -1, local_world = -1, port = -1;
    char addr[64] = {};
    BOOST_REQUIRE(std::sscanf(rest.c_str(), "R=%d W=%d L=%d LW=%d A=%63s P=%d", &rank, &world, &local, &local_world,
                              addr, &port) == 6);
    BOOST_TEST(rank == r);
    BOOST_TEST(world == 3);
    BOOST_TEST(local == r); // one node: local rank = rank
    BOOST_TEST(local_world == 3);
    BOOST_TEST(std::string(addr) == "127.0.0.1");
    ports.insert(port);
    ranks.insert(r);
  }
  BOOST_TEST((ranks == std::set<int>{0, 1, 2}));
  BOOST_REQUIRE(ports.size() == 1u); // one master port for all
  BOOST_TEST(*ports.begin() > 0);
}

BOOST_AUTO_TEST_CASE(given_master_address_and_port_are_passed_on, *utf::timeout(60)) {
  launched l({"--nproc", "2", "--master-addr", "localhost", "--master-port", "29999", "--", rank_path, "env"});
  BOOST_TEST(WEXITSTATUS(l.finish()) == 0);
  auto rows = prefixed(l.out());
  BOOST_REQUIRE(rows.size() == 2u);
  for (auto& [r, rest] : rows)
    BOOST_TEST(rest.find("A=localhost P=29999") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(output_lines_carry_the_rank, *utf::timeout(60)) {
  launched l({"--nproc", "2", "--", rank_path, "output"});
  BOOST_TEST(WEXITSTATUS(l.finish()) == 0);
  std::multiset<std::pair<int, std::string>> out, err;
  for (auto& p : prefixed(l.out()))
    out.insert(p);
  for (auto& p : prefixed(l.err()))
    err.insert(p);
  // stdout stays stdout, stderr stays stderr; the last line without a newline is flushed at exit.
  BOOST_TEST((out == std::multiset<std::pair<int, std::string>>{{0, "out 1"}, {0, "tail"}, {1, "out 1"}, {1, "tail"}}));
  BOOST_TEST((err == std::multiset<std::pair<int, std::string>>{{0, "err 1"}, {1, "err 1"}}));
  // Each rank's lines keep their order.
  for (int r : {0, 1})
    BOOST_TEST(l.out().find("[" + std::to_string(r) + "] out 1") < l.out().find("[" + std::to_string(r) + "] tail"));
}

BOOST_AUTO_TEST_CASE(a_failing_rank_stops_the_group_promptly, *utf::timeout(60)) {
  // Rank 0 waits (up to 60 s) for a signal; rank 1 exits with status 7 at once.
  launched l({"--nproc", "2", "--", rank_path, "wait-signal", "exit:7"});
  int st = l.finish();
  BOOST_TEST(WIFEXITED(st));
  BOOST_TEST(WEXITSTATUS(st) == 7);
  BOOST_TEST(l.err().find("rank 1 (pid ") != std::string::npos);
  BOOST_TEST(l.err().find("failed: exit status 7") != std::string::npos);
  BOOST_TEST(l.run_time().count() < 15.0); // not rank 0's 60 s
}

BOOST_AUTO_TEST_CASE(a_rank_killed_by_a_signal_is_named, *utf::timeout(60)) {
  launched l({"--nproc", "3", "--", rank_path, "wait-signal", "wait-signal", "raise:11"});
  int st = l.finish();
  BOOST_TEST(WEXITSTATUS(st) == 128 + SIGSEGV);
  BOOST_TEST(l.err().find("rank 2") != std::string::npos);
  BOOST_TEST(l.err().find("killed by signal 11 (SIGSEGV)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_signal_to_the_launcher_reaches_every_rank, *utf::timeout(60)) {
  for (int sig : {SIGTERM, SIGINT}) {
    launched l({"--nproc", "3", "--", rank_path, "wait-signal"});
    BOOST_REQUIRE(l.wait_for_lines("ready", 3));
    ::kill(l.pid(), sig);
    int st = l.finish();
    BOOST_TEST(WEXITSTATUS(st) == 128 + sig);
    const std::string got = std::string("got SIG") + ::sigabbrev_np(sig);
    std::set<int> reached;
    for (auto& [r, rest] : prefixed(l.out()))
      if (rest == got)
        reached.insert(r);
    BOOST_TEST((reached == std::set<int>{0, 1, 2}), "ranks that saw " << got);
    BOOST_TEST(l.err().find(std::string("stopped by SIG") + ::sigabbrev_np(sig)) != std::string::npos);
  }
}

// coreutils' timeout sends its signal to the launcher and then to its own
// process group, the launcher included: a signal that comes again is passed on
// and said once.
BOOST_AUTO_TEST_CASE(a_signal_that_comes_twice_is_said_once, *utf::timeout(60)) {
  launched l({"--nproc", "1", "--grace-period", "2", "--", rank_path, "ignore-term"});
  BOOST_REQUIRE(l.wait_for_lines("ready", 1));
  ::kill(l.pid(), SIGTERM);
  BOOST_REQUIRE(l.wait_for_lines("passing it to the ranks", 1, 20s, true));
  ::kill(l.pid(), SIGTERM);
  int st = l.finish();
  BOOST_TEST(WEXITSTATUS(st) == 128 + SIGTERM);
  std::size_t said = 0;
  for (auto& line : launched::lines(l.err()))
    said += line.find("got SIGTERM, passing it to the ranks") != std::string::npos;
  BOOST_TEST(said == 1u);
}

BOOST_AUTO_TEST_CASE(a_rank_that_ignores_sigterm_is_killed_after_the_grace_period, *utf::timeout(60)) {
  // Rank 0 ignores SIGTERM, then lets rank 1 fail (through the FIFO), so the
  // teardown's SIGTERM finds it ignoring.
  temp_fifo fifo;
  launched l({"--nproc", "2", "--grace-period", "0.5", "--", rank_path, "ignore-term:" + fifo.path,
              "fail-after:" + fifo.path + ":5"});
  int st = l.finish();
  BOOST_TEST(WEXITSTATUS(st) == 5);
  BOOST_TEST(l.err().find("rank 0 (pid ") != std::string::npos);
  BOOST_TEST(l.err().find("did not stop within 0.5 s: sending SIGKILL") != std::string::npos);
  BOOST_TEST(l.err().find("rank 1 (pid ") != std::string::npos);
  BOOST_TEST(l.err().find("failed: exit status 5") != std::string::npos);
  BOOST_TEST(l.run_time().count() >= 0.5);
  BOOST_TEST(l.run_time().count() < 15.0);
}

// Reads the pid a print-and-pause rank wrote into `fifo`.
pid_t read_pid(const std::string& fifo) {
  int fd = ::open(fifo.c_str(), O_RDONLY);
  BOOST_REQUIRE(fd >= 0);
  std::string text;
  char buf[32];
  ssize_t n;
  while (text.find('\n') == std::string::npos && (n = ::read(fd, buf, sizeof buf)) > 0)
    text.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return static_cast<pid_t>(std::atol(text.c_str()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

BOOST_AUTO_TEST_CASE(a_killed_ranks_printed_lines_reach_the_output, *utf::timeout(60)) {
  // The rank printed a line with printf and did not flush: its stdout must
  // not be a fully buffered pipe, or the line dies with it.
  for (int sig : {SIGTERM, SIGKILL}) {
    BOOST_TEST_CONTEXT("signal " << sig) {
      temp_fifo fifo;
      launched l({"--nproc", "1", "--", rank_path, "print-and-pause:" + fifo.path});
      const pid_t pid = read_pid(fifo.path);
      BOOST_REQUIRE(pid > 0);
      BOOST_REQUIRE(::kill(pid, sig) == 0);
      int st = l.finish();
      BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 128 + sig));
      BOOST_TEST(l.out() == "[0] printed before the end\n");
      BOOST_TEST(l.err().find("[0] err before the end\n") != std::string::npos);
      BOOST_TEST(l.err().find("killed by signal " + std::to_string(sig)) != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(log_dir_keeps_each_ranks_output_even_when_killed, *utf::timeout(60)) {
  temp_fifo fifo;
  const std::string killed_dir = fifo.dir + "/killed", ended_dir = fifo.dir + "/ended";
  {
    launched l({"--nproc", "1", "--log-dir", killed_dir, "--", rank_path, "print-and-pause:" + fifo.path});
    const pid_t pid = read_pid(fifo.path);
    BOOST_REQUIRE(pid > 0);
    BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
    int st = l.finish();
    BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL));
    BOOST_TEST(read_file(killed_dir + "/attempt_0/0/stdout.log") == "printed before the end\n");
    BOOST_TEST(read_file(killed_dir + "/attempt_0/0/stderr.log") == "err before the end\n");
    // The console still gets every line, prefixed.
    BOOST_TEST(l.out() == "[0] printed before the end\n");
  }
  {
    launched l({"--nproc", "2", "--log-dir", ended_dir, "--", rank_path, "output"});
    int st = l.finish();
    BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    for (const char* rank : {"0", "1"}) {
      BOOST_TEST(read_file(ended_dir + "/attempt_0/" + rank + "/stdout.log") == "out 1\ntail\n");
      BOOST_TEST(read_file(ended_dir + "/attempt_0/" + rank + "/stderr.log") == "err 1\n");
    }
  }
  std::filesystem::remove_all(killed_dir);
  std::filesystem::remove_all(ended_dir);
}

BOOST_AUTO_TEST_CASE(a_log_dir_that_cannot_be_made_is_refused, *utf::timeout(60)) {
  launched l({"--nproc", "1", "--log-dir", "/proc/corodist-no-such-dir", "--", rank_path, "env"});
  int st = l.finish();
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 2));
  BOOST_TEST(l.err().find("--log-dir '/proc/corodist-no-such-dir' cannot be created") != std::string::npos);
  BOOST_TEST(l.out().empty());
}

BOOST_AUTO_TEST_CASE(a_program_that_cannot_start_is_reported, *utf::timeout(60)) {
  launched l({"--nproc", "2", "--", "/nonexistent/program"});
  int st = l.finish();
  BOOST_TEST(WEXITSTATUS(st) == 127);
  BOOST_TEST(l.err().find("cannot execute '/nonexistent/program': No such file or directory") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused, *utf::timeout(60)) {
  for (std::vector<std::string> args : {std::vector<std::string>{"--nproc", "2", "--nnodes", "2", "--", "true"},
                                        {"--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr",
                                         "127.0.0.1", "--master-port", "1234", "--", "true"},
                                        {"--nproc", "0", "--", "true"},
                                        {"--nproc", "1", "--nnodes", "2:1", "--", "true"},
                                        {"--nproc", "1", "--nnodes", "1:2", "--node-rank", "0", "--master-addr",
                                         "127.0.0.1", "--master-port", "1234", "--", "true"},
                                        {"--nproc", "1", "--restart-policy", "some", "--", "true"},
                                        {"--nproc", "1"}}) {
    launched l(args);
    int st = l.finish();
    BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) != 0));
    BOOST_TEST(l.out().find("[0]") == std::string::npos); // nothing started
  }
}

BOOST_AUTO_TEST_CASE(multi_node_rank_arithmetic, *utf::timeout(60)) {
  // Three launchers as three "nodes" on loopback; node 0's hosts the store.
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<launched>> nodes;
  for (int node : {2, 1, 0})
    nodes.push_back(std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "3", "--node-rank", std::to_string(node), "--nproc", "2", "--master-addr", "127.0.0.1",
        "--master-port", port, "--", rank_path, "env"}));
  std::map<int, std::string> rows;
  for (auto& n : nodes) {
    BOOST_TEST(WEXITSTATUS(n->finish()) == 0);
    for (auto& [r, rest] : prefixed(n->out()))
      rows[r] = rest;
  }
  BOOST_REQUIRE(rows.size() == 6u);
  BOOST_TEST(rows[4] == "R=4 W=6 L=0 LW=2 A=127.0.0.1 P=" + port);
  BOOST_TEST(rows[5] == "R=5 W=6 L=1 LW=2 A=127.0.0.1 P=" + port);
  BOOST_TEST(rows[0] == "R=0 W=6 L=0 LW=2 A=127.0.0.1 P=" + port);
}

BOOST_AUTO_TEST_CASE(two_nodes_meet_in_one_env_rendezvous, *utf::timeout(90)) {
  // Two launchers as two "nodes" on loopback: ranks 0-1 and 2-3 of one job.
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<launched>> nodes;
  for (int node : {1, 0})
    nodes.push_back(std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc", "2", "--master-addr", "127.0.0.1",
        "--master-port", port, "--", rank_path, "rendezvous"}));
  std::map<int, std::string> rows;
  for (auto& n : nodes) {
    BOOST_TEST(WEXITSTATUS(n->finish(60s)) == 0);
    for (auto& [r, rest] : prefixed(n->out()))
      rows[r] = rest;
  }
  BOOST_TEST(rows[0] == "rank 0 of 4 local 0");
  BOOST_TEST(rows[1] == "rank 1 of 4 local 1");
  BOOST_TEST(rows[2] == "rank 2 of 4 local 0");
  BOOST_TEST(rows[3] == "rank 3 of 4 local 1");
}

BOOST_AUTO_TEST_SUITE_END()

// ---- elastic launch --------------------------------------------------------

namespace {

/// How many lines of `text` contain `what`.
std::size_t count_lines(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto& l : launched::lines(text))
    n += l.find(what) != std::string::npos;
  return n;
}

} // namespace

BOOST_AUTO_TEST_SUITE(elastic)

BOOST_AUTO_TEST_CASE(a_failure_restarts_every_worker_under_a_new_generation, *utf::timeout(90)) {
  // Rank 1 fails with status 7 on its first start, after the rendezvous; rank
  // 0 waits for it and is stopped. Generation 1 runs both to the end.
  launched l({"--nproc", "2", "--max-restarts", "2", "--", rank_path, "rdzv-report", "rdzv-report:7"});
  int st = l.finish(60s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  BOOST_TEST(count_lines(l.out(), "[1] rank 1 of 2 gen 0 restart 0") == 1u);
  BOOST_TEST(count_lines(l.out(), "[0] rank 0 of 2 gen 1 restart 1") == 1u);
  BOOST_TEST(count_lines(l.out(), "[1] rank 1 of 2 gen 1 restart 1") == 1u);
  BOOST_TEST(count_lines(l.out(), "gen 2") == 0u);
  BOOST_TEST(count_lines(l.err(), "[1] failing on purpose with status 7") == 1u);
  BOOST_TEST(count_lines(l.err(), "rank 1 (pid ") == 1u);
  BOOST_TEST(count_lines(l.err(), "failed: exit status 7: restarting the workers of every node under generation 1 "
                                  "(restart 1 of 2)") == 1u);
}

BOOST_AUTO_TEST_CASE(every_node_restarts_when_a_rank_of_one_fails, *utf::timeout(120)) {
  // Two launchers as two nodes; rank 2 (node 1) fails on its first start:
  // both nodes' workers start again under generation 1.
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<launched>> nodes;
  for (int node : {1, 0})
    nodes.push_back(std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc", "2", "--max-restarts", "1",
        "--master-addr", "127.0.0.1", "--master-port", port, "--", rank_path, "rdzv-report", "rdzv-report",
        "rdzv-report:7", "rdzv-report"}));
  std::set<int> restarted;
  for (auto& n : nodes) {
    int st = n->finish(90s);
    BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    BOOST_TEST(count_lines(n->err(), "node 1: rank 2 (pid ") == 1u);
    BOOST_TEST(count_lines(n->err(), "restarting the workers of every node under generation 1 (restart 1 of 1)") ==
               1u);
    for (auto& [r, rest] : prefixed(n->out()))
      if (rest == "rank " + std::to_string(r) + " of 4 gen 1 restart 1")
        restarted.insert(r);
  }
  BOOST_TEST((restarted == std::set<int>{0, 1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(spent_restarts_end_with_the_status_and_the_last_stderr_lines, *utf::timeout(90)) {
  // Rank 1 writes 25 lines on stderr and exits with 9, on every start.
  launched l({"--nproc", "2", "--max-restarts", "1", "--grace-period", "2", "--", rank_path, "wait-signal",
              "stderr-exit:9:25"});
  int st = l.finish(60s);
  BOOST_TEST(WIFEXITED(st));
  BOOST_TEST(WEXITSTATUS(st) == 9);
  BOOST_TEST(count_lines(l.err(), "restarting the workers of every node under generation 1 (restart 1 of 1)") == 1u);
  BOOST_TEST(count_lines(l.err(), "failed: exit status 9; the other ranks were stopped; restarts spent (1)") == 1u);
  BOOST_TEST(count_lines(l.err(), "corodist-run: the last 20 lines of rank 1's stderr:") == 1u);
  // The report repeats the last 20 lines (5 to 24), not the earlier ones.
  BOOST_TEST(count_lines(l.err(), "corodist-run:   [1] err line 24") == 1u);
  BOOST_TEST(count_lines(l.err(), "corodist-run:   [1] err line 5") == 1u);
  BOOST_TEST(count_lines(l.err(), "corodist-run:   [1] err line 4") == 0u);
  // Rank 1 ran twice.
  BOOST_TEST(count_lines(l.err(), "[1] err line 0") == 2u);
}

BOOST_AUTO_TEST_CASE(a_second_node_that_comes_within_the_window_joins, *utf::timeout(120)) {
  // --nnodes 1:2 on two launchers: whichever binds the port hosts the store;
  // the window is long, and the second node's arrival (MAX) closes it.
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<launched>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "1:2", "--join-window", "60", "--nproc", "1", "--master-addr", "127.0.0.1", "--master-port",
        port, "--", rank_path, "rendezvous"}));
  std::map<int, std::string> rows;
  for (auto& n : nodes) {
    BOOST_TEST(WEXITSTATUS(n->finish(90s)) == 0);
    for (auto& [r, rest] : prefixed(n->out()))
      rows[r] = rest;
    BOOST_TEST(count_lines(n->err(), " of 2, ranks ") == 1u); // "generation 0: node K of 2, ranks K..K of 2"
  }
  BOOST_TEST(rows.size() == 2u);
  BOOST_TEST(rows[0] == "rank 0 of 2 local 0");
  BOOST_TEST(rows[1] == "rank 1 of 2 local 0");
}

BOOST_AUTO_TEST_CASE(an_elastic_launcher_hosts_once_a_port_held_by_another_program_is_free, *utf::timeout(60)) {
  // Another program holds the port (bound, not listening: connections to it
  // are refused): the launcher cannot host and finds no store; it says so,
  // and hosts once the port is free instead of connecting until --join-timeout.
  const std::uint16_t p = free_port();
  int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BOOST_REQUIRE(holder >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(p);
  BOOST_REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  launched l({"--nnodes", "1:2", "--join-window", "0.2", "--join-timeout", "30", "--nproc", "1", "--master-addr",
              "127.0.0.1", "--master-port", std::to_string(p), "--", rank_path, "rendezvous"});
  BOOST_TEST(l.wait_for_lines("no store answers there yet", 1, std::chrono::seconds(20), true));
  ::close(holder);
  BOOST_TEST(WEXITSTATUS(l.finish(30s)) == 0);
  BOOST_TEST(count_lines(l.err(), "generation 0: node 0 of 1, ranks 0..0 of 1") == 1u);
  BOOST_TEST(count_lines(l.err(), "no store answers there yet") == 1u);
}

BOOST_AUTO_TEST_CASE(min_nodes_start_alone_after_the_window, *utf::timeout(60)) {
  const std::string port = std::to_string(free_port());
  launched l({"--nnodes", "1:2", "--join-window", "0.5", "--nproc", "2", "--master-addr", "127.0.0.1",
              "--master-port", port, "--", rank_path, "rendezvous"});
  BOOST_TEST(WEXITSTATUS(l.finish()) == 0);
  std::map<int, std::string> rows;
  for (auto& [r, rest] : prefixed(l.out()))
    rows[r] = rest;
  BOOST_TEST(rows[0] == "rank 0 of 2 local 0");
  BOOST_TEST(rows[1] == "rank 1 of 2 local 1");
  BOOST_TEST(count_lines(l.err(), "generation 0: node 0 of 1, ranks 0..1 of 2") == 1u);
}

// A node that comes once the job runs with fewer than MAX nodes: the running
// workers are stopped and every node meets again with it (not a restart).
BOOST_AUTO_TEST_CASE(a_late_node_is_admitted_under_a_new_generation, *utf::timeout(120)) {
  const std::string port = std::to_string(free_port());
  auto node = [&] {
    return std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "1:2", "--join-window", "0.2", "--nproc", "1", "--master-addr", "127.0.0.1", "--master-port",
        port, "--", rank_path, "rdzv-grow:2"});
  };
  auto first = node();
  BOOST_REQUIRE(first->wait_for_lines("[0] holding", 1, 60s)); // generation 0 runs alone
  auto second = node();
  std::set<std::string> rows;
  for (auto* n : {first.get(), second.get()}) {
    int st = n->finish(90s);
    BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    for (auto& [r, rest] : prefixed(n->out()))
      rows.insert(rest);
  }
  BOOST_TEST(rows.count("rank 0 of 1 gen 0 restart 0") == 1u);
  BOOST_TEST(rows.count("rank 0 of 2 gen 1 restart 0") == 1u);
  BOOST_TEST(rows.count("rank 1 of 2 gen 1 restart 0") == 1u);
  BOOST_TEST(count_lines(first->err(), "a node is waiting to join the job (1 of at most 2 nodes): restarting the "
                                       "workers of every node under generation 1 (not counted as a restart)") == 1u);
  BOOST_TEST(count_lines(second->err(), "the running workers are stopped to admit it") == 1u);
}

// The store lives in node 0's launcher: its death ends the job on the other nodes.
BOOST_AUTO_TEST_CASE(the_death_of_node_0s_launcher_ends_the_job, *utf::timeout(120)) {
  const std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<launched>> nodes;
  for (int node : {0, 1})
    nodes.push_back(std::make_unique<launched>(std::vector<std::string>{
        "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc", "1", "--max-restarts", "3", "--master-addr",
        "127.0.0.1", "--master-port", port, "--", rank_path, "rdzv-hold"}));
  BOOST_REQUIRE(nodes[1]->wait_for_lines("[1] holding", 1, 60s));
  ::kill(nodes[0]->pid(), SIGKILL);
  nodes[0]->finish();
  int st = nodes[1]->finish(60s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 1));
  BOOST_TEST(count_lines(nodes[1]->err(), "corodist-run: lost the job's store at 127.0.0.1:" + port +
                                              " (the launcher of node 0 hosts it: has it ended?)") == 1u);
  BOOST_TEST(count_lines(nodes[1]->err(), "restarting") == 0u); // no restart without the store
}

// Rank 0, which used to host the store, is killed with SIGKILL: the store is
// the launcher's, so rank 1 goes on using it; --restart-policy worker starts
// rank 0 alone again (same generation), it rejoins the rendezvous and tells
// rank 1 so through the store.
BOOST_AUTO_TEST_CASE(the_store_outlives_a_killed_rank_and_worker_policy_restarts_it_alone, *utf::timeout(90)) {
  launched l({"--nproc", "2", "--restart-policy", "worker", "--max-restarts", "1", "--", rank_path, "ft"});
  BOOST_REQUIRE(l.wait_for_lines("[0] ready", 1));
  int pid = -1;
  for (auto& [r, rest] : prefixed(l.out()))
    if (r == 0)
      std::sscanf(rest.c_str(), "rank 0 restart 0 pid %d", &pid);
  BOOST_REQUIRE(pid > 0);
  BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
  int st = l.finish(60s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  BOOST_TEST(count_lines(l.out(), "[0] rank 0 restart 1 pid ") == 1u);
  BOOST_TEST(count_lines(l.out(), "[1] saw rank 0 rejoin") == 1u);
  BOOST_TEST(count_lines(l.out(), "[1] rank 1 restart") == 1u); // rank 1 ran once
  BOOST_TEST(count_lines(l.err(), "killed by signal 9 (SIGKILL); restarting it (restart 1 of 1, --restart-policy "
                                  "worker)") == 1u);
  BOOST_TEST(count_lines(l.err(), "generation 1") == 0u);
}

// A worker of generation 0 that tries its env:// rendezvous once the job is
// at generation 1 is refused, and the generations' keys are apart.
BOOST_AUTO_TEST_CASE(a_worker_of_an_old_generation_cannot_join, *utf::timeout(90)) {
  const auto port = free_port();
  launched l({"--nproc", "2", "--max-restarts", "1", "--master-port", std::to_string(port), "--", rank_path,
              "rdzv-hold", "rdzv-hold:7"});
  BOOST_REQUIRE(l.wait_for_lines("gen 1 restart 1", 2, 60s));
  BOOST_REQUIRE(l.wait_for_lines("holding", 2, 30s));
  corodist::test::child_process stale([port] {
    for (auto& [k, v] : std::map<std::string, std::string>{{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                           {"CORODIST_GENERATION", "0"},
                                                           {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                           {"RANK", "1"},
                                                           {"WORLD_SIZE", "2"},
                                                           {"MASTER_ADDR", "127.0.0.1"},
                                                           {"MASTER_PORT", std::to_string(port)}})
      ::setenv(k.c_str(), v.c_str(), 1);
    corodist::event_loop loop;
    loop.start();
    cs::rendezvous_options o;
    o.timeout = 20s;
    o.auth_token = "";
    try {
      cs::rendezvous(loop, "env://", o);
      return 3;
    } catch (const corodist::store::store_error& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "%s\n", what.c_str());
      return what.find("started for generation 0 of the job, which is at generation 1") != std::string::npos ? 0 : 4;
    }
  });
  BOOST_TEST(stale.wait() == 0);

  {
    corodist::event_loop loop;
    loop.start();
    cs::tcp_store_options to;
    to.port = port;
    to.auth_token = "";
    cs::sync_store s(cs::tcp_store::connect_sync(loop.get_executor(), to));
    BOOST_TEST(s.get(cs::detail::generation_key) == "1");
    // Each generation's two ranks claimed their keys under its own prefix.
    for (int g : {0, 1})
      BOOST_TEST(s.list_keys(cs::detail::generation_prefix(g) + "/corodist/rdzv/rank/").size() == 2u);
    s.set(cs::detail::generation_prefix(1) + "/release", "1");
  } // disconnected: the launcher need not wait for us
  int st = l.finish(60s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

// PyTorch ranks under corodist-run: TORCHELASTIC_USE_AGENT_STORE makes them
// clients of the launcher's store (its server speaks TCPStore's protocol), and
// a restart gives them a new TORCHELASTIC_RESTART_COUNT (their prefix).
BOOST_AUTO_TEST_CASE(pytorch_ranks_use_the_launchers_store_across_a_restart, *utf::timeout(120)) {
  const char* env_python = std::getenv("CORODIST_TEST_PYTHON");
  const std::string python = env_python ? env_python : "/usr/bin/python3";
  {
    corodist::tools::spawn_options o;
    o.argv = {python, "-c", "import torch.distributed as d; assert d.is_gloo_available()"};
    int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    o.stdout_fd = o.stderr_fd = devnull;
    int st = -1;
    try {
      pid_t pid = corodist::tools::spawn(o);
      ::waitpid(pid, &st, 0);
    } catch (const std::system_error&) {
    }
    ::close(devnull);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      BOOST_TEST_MESSAGE("skipped: " << python << " cannot import torch with gloo");
      return;
    }
  }
  launched l({"--nproc", "2", "--max-restarts", "1", "--", python, "-c",
              "import os, torch, torch.distributed as d\n"
              "d.init_process_group('gloo', init_method='env://')\n"
              "t = torch.ones(1) * (d.get_rank() + 1)\n"
              "d.all_reduce(t)\n"
              "c = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
              "print('sum', int(t.item()), 'restart', c, flush=True)\n"
              "d.barrier()\n"
              "if d.get_rank() == 1 and c == '0': raise SystemExit(3)\n"});
  int st = l.finish(90s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  for (int r : {0, 1})
    for (int c : {0, 1})
      BOOST_TEST(count_lines(l.out(), "[" + std::to_string(r) + "] sum 3 restart " + std::to_string(c)) == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- Slurm ---------------------------------------------------------------

namespace {

constexpr const char* launch_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                       "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                                       "SLURM_STEP_NODELIST"};

/// Clears the launcher and Slurm variables, sets `vars`, and restores everything at scope exit.
class scoped_env {
public:
  explicit scoped_env(const std::map<std::string, std::string>& vars) {
    for (const char* name : launch_vars) {
      if (const char* v = std::getenv(name))
        saved_[name] = v;
      ::unsetenv(name);
    }
    for (auto& [k, v] : vars)
      ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~scoped_env() {
    for (const char* name : launch_vars)
      ::unsetenv(name);
    for (auto& [k, v] : saved_)
      ::setenv(k.c_str(), v.c_str(), 1);
  }

private:
  std::map<std::string, std::string> saved_;
};

} // namespace

BOOST_AUTO_TEST_SUITE(timeline)

// --timeline: the ranks' flight recorders, asked for while they run, end up
// in one trace-event file with a process per rank and their store clients'
// requests on a track each.
BOOST_AUTO_TEST_CASE(timeline_file_has_every_rank, *utf::timeout(90)) {
  const auto path = std::filesystem::temp_directory_path() / ("corodist-timeline-" + std::to_string(::getpid()) + ".json");
  launched l({"--nproc", "2", "--timeline", path.string(), "--timeline-every", "0.2", "--", rank_path, "answer-once"});
  const int st = l.finish(60s);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0), l.err());
  BOOST_TEST(count_lines(l.out(), "answered") == 2u);
  BOOST_TEST(l.err().find("timeline of generation 0 (2 of 2 ranks): " + path.string()) != std::string::npos, l.err());
  std::ifstream in(path);
  BOOST_REQUIRE(in.good());
  const auto doc = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  std::set<int> processes, with_store_track, with_events;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      processes.insert(e.at("pid").get<int>());
    else if (e.at("ph") == "M" && e.at("name") == "thread_name" &&
             e.at("args").at("name").get<std::string>().starts_with("store "))
      with_store_track.insert(e.at("pid").get<int>());
    else if (e.at("ph") == "X")
      with_events.insert(e.at("pid").get<int>());
  }
  BOOST_TEST((processes == std::set<int>{0, 1}));
  BOOST_TEST((with_store_track == std::set<int>{0, 1}));
  BOOST_TEST((with_events == std::set<int>{0, 1}));
  const auto& ranks = doc.at("otherData").at("ranks");
  BOOST_REQUIRE_EQUAL(ranks.size(), 2u);
  for (const auto& r : ranks)
    BOOST_TEST(r.at("clock_offset_ns") == 0); // one host, one clock
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(slurm)

BOOST_AUTO_TEST_CASE(first_host_of_a_node_list) {
  using cs::detail::slurm_first_host;
  BOOST_TEST(slurm_first_host("node[01-04,07],gpu5") == "node01");
  BOOST_TEST(slurm_first_host("gpu5,node[01-04]") == "gpu5");
  BOOST_TEST(slurm_first_host("localhost") == "localhost");
  BOOST_TEST(slurm_first_host("n[7,3-4]") == "n7");
  BOOST_TEST(slurm_first_host("rack[2-3]-n[008-010],x") == "rack2-n008");
  BOOST_TEST(slurm_first_host("node[1]") == "node1");
  BOOST_TEST(slurm_first_host("[1-2]x") == "1x");
  BOOST_TEST(slurm_first_host("a.example.org,b") == "a.example.org");
}

BOOST_AUTO_TEST_CASE(malformed_node_lists_are_refused) {
  using cs::detail::slurm_first_host;
  for (const char* bad : {"", "node[01-04", "node01]", "node[]", "node[a-b]", "node[4-1]", "node[1-]",
                          "node[[1]]", ",node1", "node1,", "a,,b", "node[1,]"}) {
    try {
      (void)slurm_first_host(bad);
      BOOST_ERROR("accepted '" << bad << "'");
    } catch (const corodist::store::store_error& e) {
      BOOST_TEST(std::string(e.what()).find("bad Slurm node list '" + std::string(bad) + "'") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(slurm_variables_stand_in_for_the_launcher) {
  scoped_env env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                  {"SLURM_JOB_NODELIST", "node[01-04,07],gpu5"}, {"MASTER_PORT", "29500"}});
  auto e = cs::detail::read_launch_env();
  BOOST_TEST(e.slurm);
  BOOST_TEST(e.rank.value_or("") == "5");
  BOOST_TEST(e.world_size.value_or("") == "8");
  BOOST_TEST(e.local_rank.value_or("") == "1");
  BOOST_TEST(e.master_addr.value_or("") == "node01");
  BOOST_TEST(e.master_port.value_or("") == "29500");
  BOOST_TEST(cs::local_rank_from_env().value_or(-1) == 1);
}

BOOST_AUTO_TEST_CASE(the_step_node_list_comes_before_the_job_list) {
  scoped_env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "node[01-04]"},
                  {"SLURM_STEP_NODELIST", "node[03-04]"}});
  BOOST_TEST(cs::detail::read_launch_env().master_addr.value_or("") == "node03");
}

BOOST_AUTO_TEST_CASE(launcher_variables_win_over_slurm) {
  scoped_env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.1.2.3"},
                  {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                  {"SLURM_JOB_NODELIST", "node01"}});
  auto e = cs::detail::read_launch_env();
  BOOST_TEST(!e.slurm);
  BOOST_TEST(e.rank.value_or("") == "1");
  BOOST_TEST(e.world_size.value_or("") == "2");
  BOOST_TEST(e.master_addr.value_or("") == "10.1.2.3");
  BOOST_TEST(cs::local_rank_from_env().value_or(-1) == 0);
}

BOOST_AUTO_TEST_CASE(no_launcher_and_no_slurm, *utf::timeout(30)) {
  scoped_env env({});
  BOOST_TEST(!cs::local_rank_from_env().has_value());
  corodist::event_loop loop;
  loop.start();
  try {
    cs::rendezvous(loop, "env://");
    BOOST_ERROR("rendezvous without any variables succeeded");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("missing rank (or $RANK, or under Slurm $SLURM_PROCID)") !=
               std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(half_set_launcher_variables_are_not_mixed_with_slurm, *utf::timeout(30)) {
  scoped_env env({{"RANK", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                  {"MASTER_PORT", "1"}});
  corodist::event_loop loop;
  loop.start();
  try {
    cs::rendezvous(loop, "env://");
    BOOST_ERROR("rendezvous with RANK but no WORLD_SIZE succeeded");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("missing world_size") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(missing_master_port_is_named, *utf::timeout(30)) {
  scoped_env env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "localhost"}});
  corodist::event_loop loop;
  loop.start();
  BOOST_CHECK_EXCEPTION(cs::rendezvous(loop, "env://"), corodist::store::store_error, [](const corodist::store::store_error& e) {
    return std::string(e.what()).find("missing master_port (or $MASTER_PORT)") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(env_rendezvous_of_two_srun_tasks, *utf::timeout(90)) {
  // Two processes with only what srun would set (plus MASTER_PORT): Slurm's
  // first host, "localhost", hosts the store.
  const auto port = std::to_string(free_port());
  std::vector<std::unique_ptr<corodist::test::child_process>> tasks;
  for (int r = 0; r < 2; ++r)
    tasks.push_back(std::make_unique<corodist::test::child_process>([r, port] {
      scoped_env env({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", std::to_string(r)},
                      {"SLURM_JOB_NODELIST", "localhost,node[2-3]"}, {"MASTER_PORT", port}});
      corodist::event_loop loop;
      loop.start();
      cs::rendezvous_options o;
      o.timeout = 20s;
      o.auth_token = "";
      auto [store, rank, world] = cs::rendezvous(loop, "env://", o);
      cs::sync_store s(store);
      if (rank == 0)
        s.wait({"left/1"}, 20s); // hosts the store: leaves last
      else
        s.set("left/1", "1");
      return rank == r && world == 2 && cs::local_rank_from_env() == r ? 0 : 3;
    }));
  for (auto& t : tasks)
    BOOST_TEST(t->wait() == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(launcher_tls, *utf::precondition(corodist::test::needs_openssl{}))

// --tls-cert/--tls-key/--tls-ca: the launcher's store serves TLS only (its
// log says so) and the ranks, given CORODIST_TLS_* (mutual TLS), meet in it.
BOOST_AUTO_TEST_CASE(tls_flags_make_the_store_tls_and_reach_the_ranks, *utf::timeout(90)) {
  corodist::test::test_certs certs;
  ::setenv("CORODIST_LOG", "info", 1);
  launched l({"--nproc", "2", "--tls-cert", certs.path("server.pem"), "--tls-key", certs.path("server.key"),
              "--tls-ca", certs.path("ca.pem"), "--", rank_path, "rendezvous"});
  ::unsetenv("CORODIST_LOG");
  int st = l.finish();
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0), l.err());
  std::set<int> ranks;
  for (auto& [r, rest] : prefixed(l.out()))
    if (rest.rfind("rank ", 0) == 0)
      ranks.insert(r);
  BOOST_TEST((ranks == std::set<int>{0, 1}), l.out());
  BOOST_TEST(l.err().find("(TLS only; PyTorch TCPStore clients are refused)") != std::string::npos, l.err());
}

// The flags go together.
BOOST_AUTO_TEST_CASE(a_tls_certificate_without_its_key_is_a_usage_error, *utf::timeout(30)) {
  corodist::test::test_certs certs;
  launched l({"--nproc", "1", "--tls-cert", certs.path("server.pem"), "--tls-ca", certs.path("ca.pem"), "--",
              rank_path, "report"});
  int st = l.finish();
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 2));
  BOOST_TEST(l.err().find("--tls-cert, --tls-key and --tls-ca go together") != std::string::npos, l.err());
}

BOOST_AUTO_TEST_SUITE_END()
