// Rendezvous (env://, tcp://, file://) across real processes: joining,
// sharing one rendezvous within a process, and what its errors say.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>

#include "store/log_capture.hpp"
#include "support/child_process.hpp"
#include "support/free_port.hpp"
#include "support/temp_file.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
namespace cs = corodist::store;
using corodist::event_loop;
using corodist::test::child_process;
using corodist::test::free_port;

BOOST_AUTO_TEST_SUITE(rendezvous)

namespace {
// Runs `world` child processes that each rendezvous through `url_of(rank)`,
// pass a barrier and check every rank's key; returns how many exited 0.
// With `again`, each process then rendezvous twice more with the same URL,
// on the same event loop and on another, and must get the same store back
// (exit status 3 if not).
int run_ranks(int world, const std::function<std::string(int)>& url_of, const std::function<void(int)>& env_of = {},
              bool again = false) {
  std::vector<std::unique_ptr<child_process>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<child_process>([&, r]() -> int {
      if (env_of)
        env_of(r);
      event_loop loop, other_loop;
      loop.start();
      other_loop.start();
      cs::rendezvous_options o;
      o.timeout = 20s;
      o.auth_token = "";
      auto res = cs::rendezvous(loop, url_of(r), o);
      if (again) {
        auto second = cs::rendezvous(loop, url_of(r), o);
        auto third = cs::rendezvous(other_loop, url_of(r), o);
        if (second.store != res.store || third.store != res.store || second.rank != r || third.world_size != world)
          return 3;
      }
      cs::sync_store s(res.store);
      s.set("hello/" + std::to_string(res.rank), std::to_string(res.world_size));
      s.barrier("after-hello", res.world_size);
      std::vector<std::string> keys;
      for (int i = 0; i < world; ++i)
        keys.push_back("hello/" + std::to_string(i));
      auto vals = s.multi_get(keys);
      const int rc =
          (res.rank == r && res.world_size == world && vals == std::vector<std::string>(world, std::to_string(world)))
              ? 0
              : 2;
      // Rank 0 hosts the server: it leaves last, once every rank has checked out.
      s.barrier("before-exit", res.world_size);
      try {
        if (s.add("checked-out", 1) == res.world_size)
          s.set("all-checked-out", "1");
        if (res.rank == 0)
          s.wait({"all-checked-out"}, 5s);
      } catch (const corodist::connection_error&) {
        // rank 0 already left: our result is in
      } catch (const corodist::timeout_error&) {
        // a rank did not check out in time: its own exit status tells
      }
      return rc;
    }));
  int ok = 0;
  for (auto& rank : ranks)
    ok += rank->wait_for(60s) == 0;
  return ok;
}
} // namespace

BOOST_AUTO_TEST_CASE(tcp_url_across_processes, *utf::timeout(120)) {
  auto port = free_port();
  BOOST_TEST(run_ranks(3, [&](int r) {
               return "tcp://127.0.0.1:" + std::to_string(port) + "?rank=" + std::to_string(r) + "&world_size=3";
             }) == 3);
}

namespace {
// What a launcher sets for rank r of an env:// job of `world` ranks whose store is at host:port.
std::function<void(int)> launched_as(std::string host, std::uint16_t port, int world) {
  return [=](int r) {
    ::setenv("MASTER_ADDR", host.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  };
}
} // namespace

BOOST_AUTO_TEST_CASE(env_url_across_processes, *utf::timeout(120)) {
  BOOST_TEST(run_ranks(3, [](int) { return std::string("env://"); }, launched_as("localhost", free_port(), 3)) == 3);
}

// A second rendezvous of the same job in a process (an RPC agent's
// init_method and a process group's URL, say) shares the first one's store:
// rank 0 hosts one server, every rank joins once. (Before, rank 0's second
// server could not bind the port and rank 1 was "arrival 3 in a world of 2".)
BOOST_AUTO_TEST_CASE(env_url_twice_in_each_process_shares_one_store, *utf::timeout(120)) {
  BOOST_TEST(run_ranks(2, [](int) { return std::string("env://"); }, launched_as("127.0.0.1", free_port(), 2), true) ==
             2);
}

BOOST_AUTO_TEST_CASE(file_url_twice_in_each_process_shares_one_store, *utf::timeout(120)) {
  const corodist::test::temp_file file;
  const std::string& path = file.path;
  BOOST_TEST(run_ranks(
                 2, [&](int r) { return "file://" + path + "?rank=" + std::to_string(r) + "&world_size=2"; }, {},
                 true) == 2);
}

// Two rendezvous of one rank started together (before either has finished)
// join once: the second waits for the first and shares its store.
BOOST_AUTO_TEST_CASE(concurrent_rendezvous_of_one_rank_join_once, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  const auto port = std::to_string(free_port());
  cs::rendezvous_options o;
  o.auth_token = "";
  o.timeout = 20s;
  const std::string rank0 = "tcp://127.0.0.1:" + port + "?rank=0&world_size=2";
  auto first = asio::co_spawn(loop.get_executor(), cs::async_rendezvous(loop.get_executor(), rank0, o),
                              asio::use_future);
  auto second = asio::co_spawn(loop.get_executor(), cs::async_rendezvous(loop.get_executor(), rank0, o),
                               asio::use_future);
  BOOST_TEST((first.wait_for(0s) == std::future_status::timeout)); // rank 1 has not come
  auto rank1 = cs::rendezvous(loop, "tcp://127.0.0.1:" + port + "?rank=1&world_size=2", o);
  auto a = first.get();
  auto b = second.get();
  BOOST_TEST((a.store == b.store));
  BOOST_TEST(rank1.rank == 1);
  cs::sync_store s(rank1.store);
  BOOST_TEST(s.add("corodist/rdzv/arrived", 0) == 2);
}

// A rank that two processes claim: the second is told who holds the rank
// (process and host) and who it is itself.
BOOST_AUTO_TEST_CASE(a_rank_claimed_by_two_processes_names_both, *utf::timeout(60)) {
  const auto port = std::to_string(free_port());
  auto url = [&](int r) { return "tcp://127.0.0.1:" + port + "?rank=" + std::to_string(r) + "&world_size=2"; };
  corodist::test::pipe_pair joined, finish;
  std::vector<std::unique_ptr<child_process>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::make_unique<child_process>([&, r]() -> int {
      joined.close_read();
      finish.close_write();
      event_loop loop;
      loop.start();
      cs::rendezvous_options o;
      o.auth_token = "";
      o.timeout = 20s;
      auto res = cs::rendezvous(loop, url(r), o);
      char byte = 'j';
      if (!corodist::test::write_all(joined.write_end(), &byte, 1))
        return 2;
      corodist::test::read_all(finish.read_end(), &byte, 1); // until the parent has tried
      return 0;
    }));
  joined.close_write();
  finish.close_read();
  char bytes[2];
  BOOST_REQUIRE(corodist::test::read_all(joined.read_end(), bytes, 2));
  const auto holder = ranks[1]->pid();
  event_loop loop;
  loop.start();
  cs::rendezvous_options o;
  o.auth_token = "";
  o.timeout = 20s;
  try {
    cs::rendezvous(loop, url(1), o);
    BOOST_FAIL("a second process joined as rank 1");
  } catch (const corodist::store::store_error& e) {
    std::string what = e.what();
    BOOST_TEST(what.find("rank 1 is claimed twice: first by pid " + std::to_string(holder) + " on ") !=
                   std::string::npos,
               what);
    BOOST_TEST(what.find("now by pid " + std::to_string(::getpid()) + " on ") != std::string::npos, what);
    BOOST_TEST(what.find("two processes were started as rank 1") != std::string::npos, what);
  }
  finish.close_write();
  for (auto& r : ranks)
    BOOST_TEST(r->wait_for(30s) == 0);
}

// A process that joined a job, let its store go, and joins again is told so
// (the store it let go was the one to keep).
BOOST_AUTO_TEST_CASE(rejoining_after_releasing_the_store_is_explained, *utf::timeout(60)) {
  const corodist::test::temp_file file;
  const std::string url = "file://" + file.path + "?rank=0&world_size=1";
  event_loop loop;
  loop.start();
  auto first = cs::rendezvous(loop, url);
  first.store.reset();
  try {
    cs::rendezvous(loop, url);
    BOOST_FAIL("joined the same rendezvous twice");
  } catch (const corodist::store::store_error& e) {
    std::string what = e.what();
    BOOST_TEST(what.find("rank 0 joined this rendezvous before, from this process (pid " +
                         std::to_string(::getpid())) != std::string::npos,
               what);
    BOOST_TEST(what.find("has been released since") != std::string::npos, what);
  }
}

// A child forked after its parent joined a job does not get the parent's
// store (a copy whose event loop does not run in the child): it joins
// itself, and is told the parent holds the rank.
BOOST_AUTO_TEST_CASE(a_forked_child_does_not_share_its_parents_rendezvous, *utf::timeout(60)) {
  const corodist::test::temp_file file;
  const std::string url = "file://" + file.path + "?rank=0&world_size=1";
  event_loop loop;
  loop.start();
  auto parent = cs::rendezvous(loop, url);
  const auto parent_pid = std::to_string(::getpid());
  corodist::test::pipe_pair err;
  child_process child([&]() -> int {
    err.close_read();
    event_loop child_loop;
    child_loop.start();
    try {
      cs::rendezvous(child_loop, url);
      return 2;
    } catch (const corodist::store::store_error& e) {
      std::string what = e.what();
      corodist::test::write_all(err.write_end(), what.data(), what.size());
      return what.find("claimed twice: first by pid " + parent_pid) != std::string::npos ? 0 : 3;
    }
  });
  err.close_write();
  const int rc = child.wait_for(30s);
  std::string what(4096, '\0');
  what.resize(static_cast<std::size_t>(std::max<ssize_t>(0, ::read(err.read_end(), what.data(), what.size()))));
  BOOST_TEST(rc == 0, what);
}

// Another job (here another world size) cannot be hosted on a port this
// process hosts a rendezvous on: the error says so.
BOOST_AUTO_TEST_CASE(another_job_on_a_hosted_port_is_named, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  const auto port = std::to_string(free_port());
  cs::rendezvous_options o;
  o.auth_token = "";
  auto job = cs::rendezvous(loop, "tcp://127.0.0.1:" + port + "?rank=0&world_size=1", o);
  try {
    cs::rendezvous(loop, "tcp://127.0.0.1:" + port + "?rank=0&world_size=2", o);
    BOOST_FAIL("two jobs hosted on one port");
  } catch (const corodist::connection_error& e) {
    std::string what = e.what();
    BOOST_TEST(what.find("rank 0 cannot host the store") != std::string::npos, what);
    BOOST_TEST(what.find("this process hosts the rendezvous of another job there, as rank 0 of a world of 1") !=
                   std::string::npos,
               what);
  }
}

// Two store servers never share a port (the listener sets SO_REUSEADDR, not
// SO_REUSEPORT): the second is refused, rather than splitting the clients.
BOOST_AUTO_TEST_CASE(two_servers_cannot_share_a_port, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  cs::server_options so;
  so.auth_token = "";
  auto first = cs::store_server::start(loop.get_executor(), so);
  so.port = first->local_endpoint().port();
  try {
    cs::store_server::start(loop.get_executor(), so);
    BOOST_FAIL("a second server bound the port of the first");
  } catch (const corodist::connection_error& e) {
    BOOST_TEST(std::string(e.what()).find("Address already in use") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(file_url_across_processes, *utf::timeout(120)) {
  const corodist::test::temp_file file;
  const std::string& path = file.path;
  BOOST_TEST(run_ranks(3, [&](int r) {
               return "file://" + path + "?rank=" + std::to_string(r) + "&world_size=3";
             }) == 3);
}

// A file:// rendezvous in a file an earlier job used fails at once, saying the
// file must be fresh (it would otherwise "complete" before the other ranks
// came) and naming the earlier claimant of the rank and this one.
BOOST_AUTO_TEST_CASE(file_url_reused_says_the_file_must_be_fresh, *utf::timeout(60)) {
  const corodist::test::temp_file file;
  const std::string url = "file://" + file.path + "?rank=0&world_size=1";
  child_process earlier_job([&]() -> int {
    event_loop loop;
    loop.start();
    return cs::rendezvous(loop, url).world_size == 1 ? 0 : 2;
  });
  const auto earlier_pid = earlier_job.pid();
  BOOST_REQUIRE(earlier_job.wait_for(30s) == 0);
  event_loop loop;
  loop.start();
  try {
    cs::rendezvous(loop, url);
    BOOST_FAIL("a second rendezvous in the same file succeeded");
  } catch (const corodist::store::store_error& e) {
    std::string what = e.what();
    BOOST_TEST(what.find("fresh file for each job") != std::string::npos, what);
    BOOST_TEST(what.find("rank 0 is claimed twice: first by pid " + std::to_string(earlier_pid)) !=
                   std::string::npos,
               what);
    BOOST_TEST(what.find("now by pid " + std::to_string(::getpid())) != std::string::npos, what);
  }
}

// A rendezvous that lasts says so early (here after 50 ms; 5 s by default):
// which ranks are missing and, for env://, where the store is. (Before, the
// first word came after 30 s.)
BOOST_AUTO_TEST_CASE(a_slow_rendezvous_warns_early_naming_the_missing_ranks, *utf::timeout(60)) {
  corodist::test::log_capture log;
  corodist::test::warning_schedule_for_test schedule(50ms, 1h);
  event_loop loop;
  loop.start();
  const auto port = std::to_string(free_port());
  auto url = [&](int r) {
    return "env://?master_addr=127.0.0.1&master_port=" + port + "&rank=" + std::to_string(r) + "&world_size=2";
  };
  cs::rendezvous_options o;
  o.auth_token = "";
  o.timeout = 30s;
  auto rank0 = asio::co_spawn(loop.get_executor(), cs::async_rendezvous(loop.get_executor(), url(0), o),
                              asio::use_future);
  auto warned =
      log.wait_for("rendezvous at " + url(0) + " (the store at 127.0.0.1:" + port + "): 1 of 2 ranks arrived after");
  BOOST_REQUIRE_EQUAL(warned.size(), 1u);
  BOOST_TEST(warned[0].find("waiting for ranks 1 (gives up after 30 s)") != std::string::npos, warned[0]);
  auto rank1 = cs::rendezvous(loop, url(1), o);
  BOOST_TEST(rank0.get().world_size == 2);
  BOOST_TEST(log.lines("still waiting for key").empty()); // the store's own log of waits stays quiet
}

BOOST_AUTO_TEST_CASE(timeout_names_the_missing_ranks, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  auto port = free_port();
  cs::rendezvous_options o;
  o.auth_token = "";
  o.timeout = 300ms;
  try {
    cs::rendezvous(loop, "tcp://127.0.0.1:" + std::to_string(port) + "?rank=0&world_size=3", o);
    BOOST_FAIL("rendezvous of 1 out of 3 succeeded");
  } catch (const corodist::timeout_error& e) {
    std::string what = e.what();
    BOOST_TEST(what.find("only 1 of 3") != std::string::npos, what);
    BOOST_TEST(what.find("missing ranks: 1, 2") != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_CASE(bad_urls_are_rejected, *utf::timeout(30)) {
  event_loop loop;
  loop.start();
  for (const char* url : {"nope", "http://x:1?rank=0&world_size=1", "tcp://127.0.0.1:1?rank=0",
                          "tcp://127.0.0.1:1?rank=3&world_size=2", "tcp://127.0.0.1:1?rank=x&world_size=2"}) {
    BOOST_CHECK_THROW(cs::rendezvous(loop, url), corodist::store::store_error);
  }
  ::unsetenv("MASTER_ADDR");
  try {
    cs::rendezvous(loop, "env://?rank=0&world_size=1");
    BOOST_FAIL("env:// without MASTER_ADDR accepted");
  } catch (const corodist::store::store_error& e) {
    BOOST_TEST(std::string(e.what()).find("MASTER_ADDR") != std::string::npos, e.what());
  }
}

// `timeout=` is in seconds (a whole, positive number); anything else is refused, naming the unit.
BOOST_AUTO_TEST_CASE(timeout_parameter_is_whole_seconds, *utf::timeout(60)) {
  event_loop loop;
  loop.start();
  const auto port = std::to_string(free_port());
  for (const char* bad : {"-5", "0", "1.5", "5s", "", "99999999999"}) {
    try {
      cs::rendezvous(loop, "tcp://127.0.0.1:" + port + "?rank=0&world_size=2&timeout=" + bad);
      BOOST_ERROR("timeout=" << bad << " accepted");
    } catch (const corodist::store::store_error& e) {
      std::string what = e.what();
      BOOST_TEST(what.find(std::string("timeout '") + bad + "' is not a whole number of seconds") != std::string::npos,
                 what);
    }
  }
  cs::rendezvous_options o;
  o.auth_token = "";
  try { // 1 means one second (1000 ms), not one millisecond
    cs::rendezvous(loop, "tcp://127.0.0.1:" + port + "?rank=0&world_size=2&timeout=1", o);
    BOOST_FAIL("a rendezvous of 1 out of 2 succeeded");
  } catch (const corodist::timeout_error& e) {
    BOOST_TEST(std::string(e.what()).find("within 1000 ms") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
