// Failure detection in RPC (agent_options::peer_timeout): worker processes
// that hang (SIGSTOP) or die (SIGKILL) with calls pending to them fail those
// calls, and later ones, with peer_lost_error naming the worker and its rank;
// the caller goes on with the other workers and can form a new agent. Linked
// into the rpc test executable (BOOST_TEST_MODULE is in test_rpc.cpp).
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <poll.h>

#include <csignal>
#include <string>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::pipe_pair;

namespace {

constexpr auto short_timeout = 500ms;
constexpr const char* second_prefix = "corodist/rpc-second/";

std::shared_ptr<cs::store> store_client(event_loop& loop, std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  return cs::tcp_store::connect_sync(loop.get_executor(), o);
}

bool readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

rpc::agent_options options(int rank, int world, std::shared_ptr<cs::store> s) {
  auto o = corodist::test::worker_options(rank, world, std::move(s));
  o.peer_timeout = short_timeout;
  return o;
}

// Worker `rank` of 4 (a child process): offers "hang", which writes a byte to
// `entered` and blocks until the process ends, and the standard functions.
// With `second` (a pipe's read end, else -1), once a byte arrives there it
// also joins a second job of two (under another key prefix) as its rank 1.
int worker(std::uint16_t port, int rank, int entered, int hold, int second) {
  event_loop loop;
  loop.start();
  auto store = store_client(loop, port);
  rpc::agent a(loop, options(rank, 4, store));
  corodist::test::register_standard(a, "w" + std::to_string(rank));
  a.register_function("hang", [entered, hold](int v) {
    char c = 'x';
    (void)::write(entered, &c, 1);
    readable(hold, 60s); // until the process ends
    return v;
  });
  a.start();
  if (second >= 0 && readable(second, 60s)) {
    auto o = options(1, 2, store);
    o.name = "second-w" + std::to_string(rank);
    o.key_prefix = second_prefix;
    rpc::agent b(loop, o);
    corodist::test::register_standard(b, o.name);
    b.start();
    readable(hold, 60s);
  } else {
    readable(hold, 60s);
  }
  return 3;
}

} // namespace

BOOST_AUTO_TEST_SUITE(rpc_liveness)

// w1 is stopped (silent: found by the heartbeats) and w2 killed (its kernel
// closes the connection) while a call to each is pending: each call fails with
// peer_lost_error naming its worker, later calls to them fail the same way at
// once, w3 still answers, and a new agent formed in this process works.
BOOST_AUTO_TEST_CASE(stopped_and_killed_workers_fail_pending_calls_with_peer_lost_error, *utf::timeout(120)) {
  corodist::test::tcp_impl host;
  const std::uint16_t port = host.port();
  pipe_pair entered1, entered2, never, second;
  child_process w1([&] { return worker(port, 1, entered1.write_end(), never.read_end(), -1); });
  child_process w2([&] { return worker(port, 2, entered2.write_end(), never.read_end(), -1); });
  child_process w3([&] { return worker(port, 3, entered1.write_end(), never.read_end(), second.read_end()); });
  entered1.close_write();
  entered2.close_write();
  never.close_read();
  second.close_read();

  event_loop loop;
  loop.start();
  auto store = store_client(loop, port);
  rpc::agent a(loop, options(0, 4, store));
  corodist::test::register_standard(a, "w0");
  a.start();
  BOOST_TEST(a.rpc_sync<int>("w1", "add", 1, 1) == 2);
  auto stopped_call = a.rpc_async<int>("w1", "hang", 1);
  auto killed_call = a.rpc_async<int>(2, "hang", 2);
  BOOST_REQUIRE(readable(entered1.read_end(), 10s)); // both run on their workers
  BOOST_REQUIRE(readable(entered2.read_end(), 10s));
  ::kill(w1.pid(), SIGSTOP);
  ::kill(w2.pid(), SIGKILL);

  auto lost = [](corodist::future<int>& f, const std::string& name, int rank, const std::string& reason) {
    try {
      f.get();
      BOOST_ERROR("the call to " << name << " did not fail");
    } catch (const corodist::peer_lost_error& e) {
      BOOST_TEST(e.worker() == name);
      BOOST_TEST(e.rank() == rank);
      const std::string what = e.what();
      BOOST_TEST(what.find("worker '" + name + "' (rank " + std::to_string(rank) + ") lost: " + reason) !=
                     std::string::npos,
                 what);
    } catch (const std::exception& e) {
      BOOST_ERROR("the call to " << name << " failed with another error: " << e.what());
    }
  };
  lost(stopped_call, "w1", 1, "no frame received for 500 ms");
  lost(killed_call, "w2", 2, "connection closed");
  // Later calls to them fail at once, with the same error (no redial).
  auto again1 = a.rpc_async<int>("w1", "add", 1, 2);
  auto again2 = a.rpc_async<int>("w2", "add", 1, 2);
  lost(again1, "w1", 1, "no frame received");
  lost(again2, "w2", 2, "connection closed");
  // The survivor is served as before.
  BOOST_TEST(a.rpc_sync<int>("w3", "add", 2, 3) == 5);
  BOOST_TEST(a.rpc_sync<std::string>("w3", "whoami") == "w3");

  // A new agent in this process: a second job with w3.
  char go = 'g';
  BOOST_REQUIRE(corodist::test::write_all(second.write_end(), &go, 1));
  auto o = options(0, 2, store);
  o.name = "second-w0";
  o.key_prefix = second_prefix;
  rpc::agent b(loop, o);
  corodist::test::register_standard(b, o.name);
  b.start();
  BOOST_TEST(b.rpc_sync<int>("second-w3", "add", 20, 22) == 42);
  BOOST_TEST(b.rpc_sync<std::string>(1, "whoami") == "second-w3");

  b.shutdown(false);
  a.shutdown(false);
  BOOST_TEST(w2.wait() == 128 + SIGKILL);
}

BOOST_AUTO_TEST_SUITE_END()
