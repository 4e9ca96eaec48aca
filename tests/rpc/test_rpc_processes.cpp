// RPC between worker processes (fork) over a store server in the test
// process. Linked into the rpc test executable (BOOST_TEST_MODULE is in
// test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"
#include "support/program.hpp"

#include <poll.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::pipe_pair;

namespace {

/// A store server on its own loop, for worker processes to meet at.
struct store_host : corodist::test::tcp_impl {
  std::uint16_t port() const { return server->local_endpoint().port(); }
};

std::shared_ptr<cs::store> connect_store(event_loop& loop, std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  return cs::tcp_store::connect_sync(loop.get_executor(), o);
}

/// Worker `rank` of `world` (a child process): calls_everyone over the
/// store server on 127.0.0.1:`port`.
int call_everyone(std::uint16_t port, int rank, int world) {
  event_loop loop;
  loop.start();
  return corodist::test::call_everyone(loop, connect_store(loop, port), rank, world);
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

} // namespace

BOOST_AUTO_TEST_SUITE(rpc_processes)

// Three worker processes calling one another in every direction.
BOOST_AUTO_TEST_CASE(three_processes_call_in_every_direction, *utf::timeout(90)) {
  store_host host;
  const auto port = host.port();
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < 3; ++r)
    kids.push_back(std::make_unique<child_process>([port, r] { return call_everyone(port, r, 3); }));
  for (int r = 0; r < 3; ++r)
    BOOST_TEST(kids[static_cast<std::size_t>(r)]->wait() == 0, "worker " << r);
}

// A worker killed in the middle of a call: the caller's pending calls fail
// promptly with connection_error, and so do later ones.
BOOST_AUTO_TEST_CASE(worker_killed_mid_call, *utf::timeout(60)) {
  store_host host;
  const auto port = host.port();
  pipe_pair started;
  pipe_pair never; // never written: the child waits on it until killed (it closes when the test ends)
  child_process child([&]() -> int {
    started.close_read();
    never.close_write();
    event_loop loop;
    loop.start();
    auto store = connect_store(loop, port);
    rpc::agent a(loop, corodist::test::worker_options(1, 2, store));
    const int fd = started.write_end(), hold = never.read_end();
    a.register_function("hang", [fd, hold](int) {
      char c = 'x';
      (void)::write(fd, &c, 1);
      wait_readable(hold, 30s); // until killed
      return 0;
    });
    a.start();
    wait_readable(hold, 60s); // until killed
    return 3;
  });
  started.close_write();
  never.close_read();
  event_loop loop;
  loop.start();
  rpc::agent a(loop, corodist::test::worker_options(0, 2, connect_store(loop, port)));
  a.start();
  auto hung = a.rpc_async<int>("w1", "hang", 1);
  auto slow = a.rpc_async<int>("w1", "hang", 2);
  BOOST_REQUIRE(wait_readable(started.read_end(), 10s));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(child.pid(), SIGKILL);
  BOOST_CHECK_THROW(hung.get(), corodist::connection_error);
  BOOST_CHECK_THROW(slow.get(), corodist::connection_error);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("pending calls failed " << ms << " ms after the kill");
  BOOST_TEST(ms < 2000.0);
  BOOST_CHECK_THROW(a.rpc_sync<int>("w1", "hang", 3), corodist::connection_error);
  BOOST_TEST(child.wait() == 128 + SIGKILL);
  a.shutdown(false);
}

#ifdef CORODIST_RUN_PATH
// The shortest job of docs/rpc.md (start from env://, rpc_sync, rpc_async and
// co_await call, shutdown, return) ends cleanly on every rank whatever order
// they leave in, with rank 0 hosting the store: started through corodist-run,
// hundreds of times, half of them ending with a store barrier, one in four
// with three ranks. (It used to fail 1 run in 3: a rank's last store request
// met the host's closed store, or the host crashed tearing down.) A job takes
// ~50 ms here, ~0.5 s under ASan+UBSan: 300 jobs (~15 s) in the normal build,
// 40 (~20 s) in the sanitizer build, where 300 took 142 s of the case's 280 s
// on an idle machine; CORODIST_EXIT_RUNS=N runs N (a longer hunt).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int default_exit_runs = 40;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int default_exit_runs = 40;
#else
constexpr int default_exit_runs = 300;
#endif
#else
constexpr int default_exit_runs = 300;
#endif

BOOST_AUTO_TEST_CASE(jobs_end_cleanly_in_every_exit_order, *utf::timeout(280)) {
  int runs = default_exit_runs;
  if (const char* n = std::getenv("CORODIST_EXIT_RUNS"))
    runs = std::atoi(n);
  int failed = 0;
  for (int i = 0; i < runs && failed < 3; ++i) {
    const std::string nproc = i % 4 == 3 ? "3" : "2";
    corodist::test::program job({"env", "EXIT_SEED=" + std::to_string(i), std::string("END_WITH_BARRIER=") + (i % 2 ? "1" : "0"),
                                 CORODIST_RUN_PATH, "--nproc", nproc, "--", CORODIST_EXIT_WORKER_PATH});
    const int status = job.wait(60s);
    if (status != 0) {
      ++failed;
      BOOST_ERROR("run " << i << " exited with " << status << ":\n" << job.output());
    }
  }
  BOOST_TEST_MESSAGE(runs << " jobs of two or three ranks, " << failed << " failed");
  BOOST_TEST(failed == 0);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
