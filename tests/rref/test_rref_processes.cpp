// RRefs between worker processes (fork) over loopback, with a store server in
// the test process: the protocol note's four scenarios, fork chains, a
// parameter server, an owner killed while users wait, and graceful shutdowns
// that leave nothing behind. Linked into the rref test executable.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/remote.hpp>
#include <corodist/store/tcp_store.hpp>

#include "rpc/rpc_fixtures.hpp"
#include "rref/rref_jobs.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <poll.h>
#include <csignal>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace rpc = corodist::rpc;
namespace rr = corodist::rref;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using namespace corodist::test::rref_jobs;

namespace {

struct store_host : corodist::test::tcp_impl {};

std::shared_ptr<cs::store> connect_store(event_loop& loop, std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  return cs::tcp_store::connect_sync(loop.get_executor(), o);
}

/// Waits until `fd` is readable (or closed), at most `limit`.
bool wait_readable(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(limit.count())) == 1;
}

/// The port of the store server the workers meet at, read from `fd`.
std::uint16_t read_port(int fd) {
  std::uint16_t port = 0;
  if (!corodist::test::read_all(fd, &port, sizeof port))
    throw std::runtime_error("no store port from the test process");
  return port;
}

/// Runs `world` workers as processes; each must exit 0. They are forked
/// before the store server starts, while this process has no other thread (a
/// fork while another thread allocates leaves the child stuck on the
/// allocator's lock under ASan), and read its port from a pipe.
void run_job(int world, const std::function<void(rpc::agent&)>& setup,
             const std::function<void(rpc::agent&, int)>& body) {
  corodist::test::pipe_pair go;
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < world; ++r)
    kids.push_back(std::make_unique<child_process>([&, r] {
      return worker("127.0.0.1", read_port(go.read_end()), r, world, setup, [&](rpc::agent& a) { body(a, r); });
    }));
  store_host host;
  const std::uint16_t port = host.port();
  for (int r = 0; r < world; ++r)
    BOOST_REQUIRE(corodist::test::write_all(go.write_end(), &port, sizeof port));
  for (int r = 0; r < world; ++r)
    BOOST_TEST(kids[static_cast<std::size_t>(r)]->wait_for(60s) == 0, "worker " << r << " failed");
}

} // namespace

BOOST_AUTO_TEST_SUITE(rref_processes)

// The note's four scenarios with three workers; every worker then shuts down
// gracefully (w2 still holding a reference) and holds nothing afterwards.
BOOST_AUTO_TEST_CASE(the_four_scenarios, *utf::timeout(120)) {
  run_job(3, standard, four_scenarios);
}

// OwnerRRef -> A -> Y -> Z (the owner starts it), and A -> Y -> Z started on a user.
BOOST_AUTO_TEST_CASE(fork_chains, *utf::timeout(120)) {
  run_job(4, standard, [](rpc::agent& a, int rank) {
    if (rank != 0)
      return;
    expect(a.rpc_sync<int>("w1", "start_chain", 21, std::vector<int>{0, 2, 3}) == 21, "owner -> w0 -> w2 -> w3");
    auto r = rr::remote<int>(a, "w1", "make", 22);
    expect(a.rpc_sync<int>("w2", "chain", r, std::vector<int>{3, 0}) == 22, "w0 -> w2 -> w3 -> w0 (a user's chain)");
    expect(a.rpc_sync<int>("w2", "chain", r, std::vector<int>{1}) == 22, "w0 -> w2 -> w1 (back to the owner)");
  });
}

// Trainers update values held by an RRef on one server through rref.rpc_sync.
BOOST_AUTO_TEST_CASE(parameter_server, *utf::timeout(120)) {
  run_job(1 + trainers, standard, [](rpc::agent& a, int rank) {
    if (rank == 0) {
      expect(all_trained.get_future().wait_for(60s) == std::future_status::ready, "every trainer finished");
      for (double x : *params.local_value())
        expect(x == trainers * steps * 0.5, "every update was applied once");
      params = {};
      return;
    }
    auto p = a.rpc_sync<rr::rref<std::vector<double>>>("w0", "get_params");
    expect(p.owner() == 0 && !p.is_owner(), "the server owns the parameters");
    double last = 0;
    for (int s = 0; s < steps; ++s)
      last = p.rpc_sync<double>("update", 0.5);
    expect(last >= 4 * 0.5 * steps, "updates return the new sum");
    a.rpc_sync<int>("w0", "trainer_done");
  });
}

/// Worker w1 in a child process (forked before any thread of ours starts, see
/// run_job) whose function "hang" tells `started` and hangs until the process
/// is killed; worker w0 here, its agent made with `peer_timeout` when given.
struct hanging_owner_job {
  corodist::test::pipe_pair started, go;
  corodist::test::pipe_pair never; // never written: the owner waits on it until killed
  std::unique_ptr<child_process> owner;
  std::optional<store_host> host;
  event_loop loop;
  std::optional<rpc::agent> a;

  explicit hanging_owner_job(std::optional<std::chrono::milliseconds> peer_timeout = {}) {
    owner = std::make_unique<child_process>([&] {
      started.close_read();
      never.close_write();
      const auto port = read_port(go.read_end());
      event_loop l;
      l.start();
      auto o = corodist::test::worker_options(1, 2, connect_store(l, port));
      if (peer_timeout)
        o.peer_timeout = *peer_timeout;
      rpc::agent w1(l, o);
      rr::enable(w1);
      const int fd = started.write_end(), hold = never.read_end();
      w1.register_function("hang", [fd, hold](int v) {
        char c = 'x';
        (void)::write(fd, &c, 1);
        wait_readable(hold, 60s); // until killed
        return v;
      });
      w1.start();
      wait_readable(hold, 60s); // until killed
      return 3;
    });
    started.close_write();
    never.close_read();
    host.emplace();
    const std::uint16_t port = host->port();
    BOOST_REQUIRE(corodist::test::write_all(go.write_end(), &port, sizeof port));
    loop.start();
    auto o = corodist::test::worker_options(0, 2, connect_store(loop, port));
    if (peer_timeout)
      o.peer_timeout = *peer_timeout;
    a.emplace(loop, o);
    rr::enable_options co;
    co.give_up_after = 2s; // the delete that the dropped reference sends to the lost owner
    rr::enable(*a, co);
    a->start();
  }
};

// An owner killed (SIGKILL) while users wait in to_here: every wait fails with
// peer_lost_error (a connection_error) naming the owner promptly, later uses
// too, and nothing hangs.
BOOST_AUTO_TEST_CASE(owner_killed_while_users_wait, *utf::timeout(60)) {
  hanging_owner_job job;
  auto& a = *job.a;
  auto& owner = *job.owner;
  auto r = rr::remote<int>(a, "w1", "hang", 5);
  auto first = r.to_here();
  auto second = r.to_here();
  BOOST_REQUIRE(wait_readable(job.started.read_end(), 10s)); // the function is running on the owner
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(owner.pid(), SIGKILL);
  // The errors name the operation, the RRef and its owner (they used to say
  // "request of kind 1537 on worker 'w1'").
  const std::string closed =
      "to_here of RRef R" + r.id().str() + " owned by 'w1': worker 'w1' (rank 1) lost: connection closed";
  for (auto* f : {&first, &second}) {
    std::string what;
    try {
      f->get();
    } catch (const corodist::peer_lost_error& e) {
      what = e.what();
      BOOST_TEST(e.worker() == "w1");
      BOOST_TEST(e.rank() == 1);
    }
    BOOST_TEST(what == closed);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("to_here failed " << ms << " ms after the owner was killed");
  BOOST_TEST(ms < 1000.0);
  try { // the owner is lost: no dial again (as PyTorch's RPC, no retry)
    r.to_here().get();
    BOOST_ERROR("to_here() after the owner died did not fail");
  } catch (const corodist::peer_lost_error& e) {
    BOOST_TEST(std::string(e.what()).starts_with("to_here of RRef R" + r.id().str() + " owned by 'w1': "), e.what());
  }
  BOOST_TEST(owner.wait_for(10s) == 128 + SIGKILL);
  r = {};
  a.shutdown(false);
}

// An owner that hangs (SIGSTOP) while users wait in to_here: the heartbeats
// stop, and after the agent's peer_timeout every wait fails with
// peer_lost_error naming the owner and the silence; later uses fail at once.
BOOST_AUTO_TEST_CASE(owner_stopped_while_users_wait, *utf::timeout(60)) {
  constexpr auto peer_timeout = 500ms;
  hanging_owner_job job(peer_timeout);
  auto& a = *job.a;
  auto& owner = *job.owner;
  auto r = rr::remote<int>(a, "w1", "hang", 5);
  auto waiting = r.to_here();
  BOOST_REQUIRE(wait_readable(job.started.read_end(), 10s)); // the function is running on the owner
  ::kill(owner.pid(), SIGSTOP);
  const std::string expected = "to_here of RRef R" + r.id().str() +
                               " owned by 'w1': worker 'w1' (rank 1) lost: no frame received for 500 ms (peer_timeout)";
  std::string what;
  try {
    waiting.get();
  } catch (const corodist::peer_lost_error& e) {
    what = e.what();
    BOOST_TEST(e.worker() == "w1");
    BOOST_TEST(e.rank() == 1);
  } catch (const std::exception& e) {
    what = std::string("another error: ") + e.what();
  }
  BOOST_TEST(what == expected);
  BOOST_CHECK_THROW(r.to_here().get(), corodist::peer_lost_error);
  r = {};
  a.shutdown(false);
}

BOOST_AUTO_TEST_SUITE_END()
