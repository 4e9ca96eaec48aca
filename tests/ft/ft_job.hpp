#pragma once
// A job of examples/ft_train.cpp replicas for the ft tests: a store_server of
// the test's (in the launcher's place), replica processes started and
// restarted by the test, their output read line by line, and the checks at
// the end: every replica's weights and momentum bit-equal, and equal to a
// replay of the committed steps in one process.

#include <boost/test/unit_test.hpp>

#include "support/child_process.hpp"
#include "support/host_bed.hpp"
#include "support/program.hpp"
#include "support/temp_file.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/store/store_server.hpp>

#include <asio/io_context.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace corodist::test {

/// What ft_train prints for one committed step: "committed <step> <members>", by step.
inline std::map<int, std::string> committed_steps(const std::string& output) {
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

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Replicas r0..r<n-1> of ft_train: on this machine with the store in the
/// test process, or on a host bed (replica i on host i + 1, the store on host
/// 0, the launcher's place).
struct ft_job {
  using env_list = std::vector<std::pair<std::string, std::string>>;
  /// Starts replica i's program: by default in this network namespace.
  using launcher = std::function<std::unique_ptr<program>(int i, std::vector<std::string> argv, env_list env)>;

  int replicas;
  int steps;
  int step_ms;
  host_bed* bed = nullptr;
  std::string store_host = "127.0.0.1"; ///< the address the replicas reach the store at
  std::uint16_t store_port = 0;
  env_list extra_env; ///< added to every replica's environment
  launcher launch = [](int, std::vector<std::string> argv, env_list env) {
    return std::make_unique<program>(argv, env);
  };
  std::optional<corodist::event_loop> loop;
  std::shared_ptr<corodist::store::store_server> server;
  std::unique_ptr<child_process> store_process; // on the bed's host 0
  std::vector<temp_file> outs;
  int held = -1;        ///< the replica hold() holds
  int held_after = 0;   ///< the step it holds after
  temp_file hold_file;  ///< not empty: the held replica goes on
  std::vector<std::unique_ptr<program>> ps;
  std::vector<std::string> done_output;

  /// Replicas on this machine; the store in this process.
  ft_job(int n, int steps_, int step_ms_) : replicas(n), steps(steps_), step_ms(step_ms_), outs(n), ps(n), done_output(n) {
    use_test_deadline();
    loop.emplace();
    loop->start();
    corodist::store::server_options so;
    so.host = store_host;
    so.port = 0;
    server = corodist::store::store_server::start(loop->get_executor(), so);
    store_port = server->local_endpoint().port();
  }

  /// Replicas on hosts 1..n of `b`, the store on its host 0.
  ft_job(host_bed& b, int n, int steps_, int step_ms_)
      : replicas(n), steps(steps_), step_ms(step_ms_), bed(&b), store_host(b.address(0)), outs(n), ps(n),
        done_output(n) {
    BOOST_REQUIRE(b.size() > n);
    use_test_deadline();
    pipe_pair port_pipe;
    store_process = b.run(0, [&] {
      asio::io_context ctx;
      corodist::store::server_options so;
      so.host = store_host;
      so.port = 0;
      auto srv = corodist::store::store_server::start(ctx.get_executor(), so);
      std::uint16_t port = srv->local_endpoint().port();
      write_all(port_pipe.write_end(), &port, sizeof port);
      ctx.run(); // until killed
      return 0;
    });
    port_pipe.close_write();
    BOOST_REQUIRE(read_all(port_pipe.read_end(), &store_port, sizeof store_port));
    extra_env.emplace_back("GLOO_SOCKET_IFNAME", "eth0"); // the host's address, not its own 127.0.0.1
    launch = [this](int i, std::vector<std::string> argv, env_list env) {
      argv.insert(argv.begin(), {"ip", "netns", "exec", bed->netns(i + 1)});
      return std::make_unique<program>(argv, env);
    };
  }

  ~ft_job() {
    ps.clear();
    if (server) server->stop();
  }

  /// The heartbeat deadline of the tests (1 s), for the store's connections
  /// as for the replicas' (connection_options read it when made).
  static void use_test_deadline() { ::setenv("CORODIST_PEER_TIMEOUT_MS", peer_timeout_ms, 1); }
  static constexpr const char* peer_timeout_ms = "1000";

  /// The replica's host on the bed.
  int host_of(int replica) const { return replica + 1; }

  /// (Re)starts replica i.
  void start(int i) {
    auto argv = argv_of(i);
    if (i == held)
      argv.insert(argv.end(), {"--hold-after", std::to_string(held_after), "--hold-file", hold_file.path});
    env_list env{{"MASTER_ADDR", store_host},
                 {"MASTER_PORT", std::to_string(store_port)},
                 {"CORODIST_PEER_TIMEOUT_MS", peer_timeout_ms}};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    ps[i] = launch(i, argv, env);
  }

  /// Makes replica i (from its next start) wait after committing step
  /// `after` until release(): a fault goes in place at a known step.
  void hold(int i, int after) {
    held = i;
    held_after = after;
  }

  /// Lets the held replica go on.
  void release() { std::ofstream(hold_file.path) << "go"; }

  /// Replica i's command line.
  std::vector<std::string> argv_of(int i) {
    std::vector<std::string> argv{CORODIST_FT_TRAIN_PATH, "--replica", "r" + std::to_string(i), "--steps",
                                  std::to_string(steps), "--min-replicas", std::to_string(replicas - 1),
                                  "--initial-replicas", std::to_string(replicas), "--finish-with",
                                  std::to_string(replicas),
                                  "--step-ms", std::to_string(step_ms), "--group-timeout-ms", "5000", "--out",
                                  outs[i].path};
    return argv;
  }

  void start_all() {
    for (int i = 0; i < replicas; ++i) start(i);
  }

  /// Reads replica i's output until a line starts with `prefix` and holds `part`.
  void await_line(int i, const std::string& prefix, const std::string& part = {}) {
    for (;;) {
      auto line = ps[i]->read_line(std::chrono::seconds(60));
      if (!line) // (a message's operands are evaluated even when the check holds)
        BOOST_FAIL("replica " << i << " never printed '" << prefix << "..." << part << "': " << ps[i]->output()
                              << others_output(i));
      if (line->rfind(prefix, 0) == 0 && line->find(part) != std::string::npos) return;
    }
  }

  /// Every replica's output but replica i's, for a failure's message.
  std::string others_output(int i) {
    std::string all;
    for (int j = 0; j < replicas; ++j)
      if (j != i && ps[j])
        all += "\n--- replica " + std::to_string(j) + ":\n" + ps[j]->drain();
    return all;
  }

  /// Waits for every replica to end; true when all exited 0.
  bool finish() {
    bool ok = true;
    for (int i = 0; i < replicas; ++i) {
      int status = ps[i]->wait(std::chrono::seconds(120));
      done_output[i] = ps[i]->output();
      BOOST_TEST_INFO("replica " << i << " output:\n" << done_output[i]);
      BOOST_TEST(status == 0);
      ok = ok && status == 0;
    }
    return ok;
  }

  /// Every replica's final state equals the others' and the replay of
  /// replica `log`'s committed steps; the replicas agree on every step's members.
  void check_equal_and_replayed(int log = 0) {
    auto first = slurp(outs[0].path);
    BOOST_REQUIRE(first.size() == 2 * 64 * sizeof(float));
    for (int i = 1; i < replicas; ++i) BOOST_TEST(slurp(outs[i].path) == first, "replica " << i << " differs");
    auto reference = committed_steps(done_output[log]);
    BOOST_TEST(reference.size() >= static_cast<std::size_t>(steps));
    BOOST_TEST(reference.rbegin()->first + 1 == static_cast<int>(reference.size()), "a step is missing");
    for (int i = 0; i < replicas; ++i)
      for (auto& [s, members] : committed_steps(done_output[i]))
        BOOST_TEST(reference[s] == members, "replica " << i << " step " << s);
    temp_file log_file, replayed;
    std::ofstream(log_file.path) << done_output[log];
    program r({CORODIST_FT_TRAIN_PATH, "--replay", log_file.path, "--out", replayed.path});
    BOOST_TEST_REQUIRE(r.wait(std::chrono::seconds(60)) == 0, r.output());
    BOOST_TEST(slurp(replayed.path) == first, "the replay differs");
  }
};

} // namespace corodist::test
