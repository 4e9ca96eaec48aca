// The Gloo backend with ranks as real processes (fork) over loopback, meeting
// at a store server in the test process: every collective on 2, 3 and 4
// ranks, a 64 MiB allreduce, and a rank killed in the middle of collectives.
#include <boost/test/unit_test.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/store/tcp_store.hpp>

#include "collective/collective_checks.hpp"
#include "collective/gloo_fixtures.hpp"
#include "store/store_fixtures.hpp"
#include "support/child_process.hpp"

#include <poll.h>

#include <cstdio>
#include <memory>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cc = corodist::collective;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::pipe_pair;

namespace {

/// A store server on its own loop, for rank processes to meet at.
using store_host = corodist::test::tcp_impl;

/// The body of a rank process: joins the group `prefix` of `size` ranks at the
/// store on `port`, runs `body`, and returns its exit code (failures are
/// printed to stderr: the test's log).
int rank_process(std::uint16_t port, int rank, int size, const std::string& prefix,
                 const std::function<int(cc::gloo_group&)>& body, bool check_calls = false) {
  event_loop loop;
  loop.start();
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = 20s;
  auto store = cs::tcp_store::connect_sync(loop.get_executor(), o);
  auto opts = corodist::test::gloo_test_options(prefix, 30s);
  opts.check_calls = check_calls;
  auto pg = cc::gloo_group::create_sync(store, rank, size, opts);
  return body(*pg);
}

int every_collective(cc::gloo_group& pg) {
  auto f = corodist::test::check_every_collective(pg);
  if (!f.ok())
    std::fprintf(stderr, "rank %d of %d:\n%s", pg.rank(), pg.size(), f.text().c_str());
  return f.ok() ? 0 : 1;
}

/// Runs `size` rank processes; returns their exit codes.
std::vector<int> run_processes(store_host& host, int size, const std::string& prefix,
                               const std::function<int(cc::gloo_group&)>& body, bool check_calls = false) {
  const auto port = host.port();
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < size; ++r)
    kids.push_back(
        std::make_unique<child_process>([=] { return rank_process(port, r, size, prefix, body, check_calls); }));
  std::vector<int> codes;
  for (auto& k : kids)
    codes.push_back(k->wait());
  return codes;
}

bool wait_readable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

} // namespace

BOOST_AUTO_TEST_SUITE(gloo_processes, *utf::precondition(corodist::test::gloo_built))

// (3 ranks with the call-header check on, 2 and 4 without.)
BOOST_AUTO_TEST_CASE(every_collective_on_2_3_and_4_process_ranks, *utf::timeout(180)) {
  store_host host;
  for (int size : {2, 3, 4}) {
    auto codes = run_processes(host, size, "proc/" + std::to_string(size), every_collective, size == 3);
    for (int r = 0; r < size; ++r)
      BOOST_TEST(codes[static_cast<std::size_t>(r)] == 0, "rank " << r << " of " << size);
  }
}

// One 64 MiB float32 allreduce (16 Mi elements) between two processes.
BOOST_AUTO_TEST_CASE(allreduce_of_64_MiB, *utf::timeout(120)) {
  store_host host;
  auto codes = run_processes(host, 2, "big", [](cc::gloo_group& pg) {
    const std::size_t n = std::size_t{16} << 20;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(i % 1000) * static_cast<float>(pg.rank() + 1);
    pg.allreduce(v).get();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += v[i] != static_cast<float>(i % 1000) * 3.0f;
    if (wrong)
      std::fprintf(stderr, "rank %d: %zu wrong elements\n", pg.rank(), wrong);
    return wrong == 0 ? 0 : 1;
  });
  BOOST_TEST(codes[0] == 0);
  BOOST_TEST(codes[1] == 0);
}

// Three ranks loop on 16 MiB allreduces; rank 2 is killed with SIGKILL in
// the middle. Ranks 0 and 1 fail with collective_error (a peer's connection
// ended, not a timeout) promptly, far inside their 30 s deadline.
BOOST_AUTO_TEST_CASE(rank_killed_mid_collective, *utf::timeout(120)) {
  store_host host;
  const auto port = host.port();
  constexpr int size = 3;
  // Exit codes of the survivors.
  enum : int { failed_as_expected = 0, wrong_error = 2, timed_out = 3, never_failed = 4, other = 5 };
  auto survivor = [](cc::gloo_group& pg) {
    std::vector<float> v(std::size_t{4} << 20, 1.0f);
    for (int i = 0; i < 100000; ++i) {
      try {
        pg.allreduce(v).get();
      } catch (const cc::collective_timeout_error& e) {
        std::fprintf(stderr, "rank %d: %s\n", pg.rank(), e.what());
        return static_cast<int>(timed_out);
      } catch (const cc::collective_error& e) {
        std::fprintf(stderr, "rank %d failed as expected: %s\n", pg.rank(), e.what());
        const std::string what = e.what();
        return what.find("allreduce #") != std::string::npos ? static_cast<int>(failed_as_expected)
                                                             : static_cast<int>(wrong_error);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", pg.rank(), e.what());
        return static_cast<int>(other);
      }
    }
    return static_cast<int>(never_failed);
  };
  pipe_pair started;
  std::vector<std::unique_ptr<child_process>> kids;
  for (int r = 0; r < 2; ++r)
    kids.push_back(std::make_unique<child_process>([=] { return rank_process(port, r, size, "kill", survivor); }));
  child_process victim([&] {
    started.close_read();
    return rank_process(port, 2, size, "kill", [&](cc::gloo_group& pg) {
      std::vector<float> v(std::size_t{4} << 20, 1.0f);
      pg.allreduce(v).get();
      char c = 'x';
      (void)!::write(started.write_end(), &c, 1); // now in the loop of collectives
      for (int i = 0; i < 100000; ++i)
        pg.allreduce(v).get();
      return 9;
    });
  });
  started.close_write();
  BOOST_REQUIRE(wait_readable(started.read_end(), 60s));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(victim.pid(), SIGKILL);
  BOOST_TEST(victim.wait() == 128 + SIGKILL);
  for (int r = 0; r < 2; ++r) {
    const int code = kids[static_cast<std::size_t>(r)]->wait();
    BOOST_TEST(code == static_cast<int>(failed_as_expected), "rank " << r << " exited with " << code);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("survivors failed " << s << " s after the kill");
  BOOST_TEST(s < 10.0);
}

BOOST_AUTO_TEST_SUITE_END()
