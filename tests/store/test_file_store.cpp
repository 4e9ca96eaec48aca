// file_store across processes (and across threads of one process): the parts
// the generic store tests cannot see. Linked into a test executable whose
// BOOST_TEST_MODULE is defined in another translation unit.
#include <boost/test/unit_test.hpp>

#include <corodist/core/error.hpp>
#include <corodist/store/file_store.hpp>

#include "support/child_process.hpp"
#include "support/coro_test.hpp"
#include "support/temp_file.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace utf = boost::unit_test;
// (not `using ...::file_store`: the test suite below is a namespace of that name)
namespace cs = corodist::store;
using corodist::test::child_process;
using corodist::test::temp_file;
using corodist::test::pipe_pair;
using corodist::test::read_all;
using corodist::test::run_in_child;
using corodist::test::write_all;
using cs::watch_event;

namespace {


std::string le32(std::uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i)
    s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

/// One log record as file_store writes it.
std::string set_record(const std::string& key, const std::string& value) {
  return std::string(1, '\x01') + le32(static_cast<std::uint32_t>(key.size())) + key +
         le32(static_cast<std::uint32_t>(value.size())) + value;
}

/// Appends raw bytes to the file, as a crashed writer would have.
void append_raw(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(write_all(fd, bytes.data(), bytes.size()));
  ::close(fd);
}

constexpr int adds_per_worker = 500;

/// add("counter", 1) adds_per_worker times, recording the returned values.
/// Pauses briefly between adds (the loop, not the thread) so that the file
/// lock changes hands often; back to back, one worker tends to re-take it
/// before the other wakes, and the two would barely interleave.
asio::awaitable<void> add_many(std::shared_ptr<cs::file_store> s, std::vector<std::int64_t>& got) {
  asio::steady_timer pause(co_await asio::this_coro::executor);
  for (int i = 0; i < adds_per_worker; ++i) {
    auto v = co_await s->add("counter", 1);
    got.push_back(v);
    pause.expires_after(20us);
    co_await pause.async_wait(asio::use_awaitable);
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(file_store)

// Two processes each add(k, 1) 500 times at once: no update is lost, and the
// values the adds return are exactly 1..1000 (each add saw a distinct state).
BOOST_AUTO_TEST_CASE(concurrent_add_across_processes, *utf::timeout(60)) {
  temp_file file;
  pipe_pair go;      // parent -> child: start adding
  pipe_pair results; // child -> parent: the values its adds returned
  child_process child([&]() -> int {
    go.close_write();
    results.close_read();
    asio::io_context ctx;
    auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
    char byte = 0;
    if (!read_all(go.read_end(), &byte, 1))
      return 2;
    std::vector<std::int64_t> got;
    run_in_child(ctx, add_many(s, got));
    return write_all(results.write_end(), got.data(), got.size() * sizeof(std::int64_t)) ? 0 : 3;
  });
  go.close_read();
  results.close_write();

  asio::io_context ctx;
  auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  char byte = 'g';
  BOOST_REQUIRE(write_all(go.write_end(), &byte, 1));
  std::vector<std::int64_t> mine;
  corodist::test::run_coro(ctx, add_many(s, mine), 50s);

  std::vector<std::int64_t> theirs(adds_per_worker);
  BOOST_REQUIRE(read_all(results.read_end(), theirs.data(), theirs.size() * sizeof(std::int64_t)));
  BOOST_TEST(child.wait() == 0);

  auto final_value = corodist::test::run_coro(ctx, s->get("counter"));
  BOOST_TEST(final_value == std::to_string(2 * adds_per_worker));

  std::set<std::int64_t> all(mine.begin(), mine.end());
  all.insert(theirs.begin(), theirs.end());
  BOOST_TEST(all.size() == static_cast<std::size_t>(2 * adds_per_worker));
  BOOST_TEST(*all.begin() == 1);
  BOOST_TEST(*all.rbegin() == 2 * adds_per_worker);
  // Each process's own adds return increasing values.
  BOOST_TEST(std::is_sorted(mine.begin(), mine.end()));
  BOOST_TEST(std::is_sorted(theirs.begin(), theirs.end()));
  std::size_t handovers = 0; // how often the lock passed between the processes (informational)
  for (std::size_t i = 1; i < mine.size(); ++i)
    handovers += mine[i] != mine[i - 1] + 1;
  BOOST_TEST_MESSAGE("the parent's adds were interleaved with the child's " << handovers << " times");
}

namespace {
/// Ticks the loop `ticks` 5 times, 5 ms apart, while the get is pending; then
/// notes whether it still is and tells the other process (byte on `go`) to set its key.
asio::awaitable<void> tick_then_signal(int& ticks, const bool& got, bool& pending_at_go, int go) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < 5; ++i) {
    t.expires_after(5ms);
    co_await t.async_wait(asio::use_awaitable);
    ++ticks;
  }
  pending_at_go = !got;
  char byte = 'g';
  write_all(go, &byte, 1);
}

asio::awaitable<std::string> get_ready(std::shared_ptr<cs::file_store> s, int& ticks, bool& got, bool& pending_at_go,
                                       int go) {
  asio::co_spawn(co_await asio::this_coro::executor, tick_then_signal(ticks, got, pending_at_go, go), asio::detached);
  auto v = co_await s->get("ready");
  got = true;
  co_return v;
}
} // namespace

// A get() in one process waits (its loop free for other work meanwhile) for a
// key another process sets once told to: after this loop ticked 5 times.
BOOST_AUTO_TEST_CASE(get_waits_for_key_set_by_other_process, *utf::timeout(30)) {
  temp_file file;
  pipe_pair go; // parent -> child: set the key now
  child_process child([&]() -> int {
    go.close_write();
    char byte = 0;
    if (!read_all(go.read_end(), &byte, 1))
      return 2;
    asio::io_context ctx;
    auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
    run_in_child(ctx, s->set("ready", "from the child"));
    return 0;
  });
  go.close_read();

  asio::io_context ctx;
  auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  s->set_timeout(10s);
  int ticks = 0;
  bool got = false, pending_at_go = false;
  auto value = corodist::test::run_coro(ctx, get_ready(s, ticks, got, pending_at_go, go.write_end()), 20s);

  BOOST_TEST(value == "from the child");
  BOOST_TEST(ticks == 5);
  BOOST_TEST(pending_at_go); // the get waited for the other process's set
  BOOST_TEST(child.wait() == 0);
}

// wait() with a 50 ms timeout throws timeout_error naming the missing key
// (and only it) and the timeout.
BOOST_AUTO_TEST_CASE(wait_timeout_names_missing_key, *utf::timeout(30)) {
  temp_file file;
  asio::io_context ctx;
  auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  corodist::test::run_coro(ctx, s->set("here_key", "1"));

  std::string message;
  bool threw = false;
  auto start = std::chrono::steady_clock::now();
  corodist::test::run_coro(ctx, [](std::shared_ptr<cs::file_store> s, std::string& message,
                                   bool& threw) -> asio::awaitable<void> {
    std::vector<std::string> keys;
    keys.push_back("here_key");
    keys.push_back("absent_key");
    try {
      co_await s->wait(keys, 50ms);
    } catch (const corodist::timeout_error& e) {
      threw = true;
      message = e.what();
    }
  }(s, message, threw));
  auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);

  BOOST_TEST(threw);
  BOOST_CHECK_MESSAGE(message.find("absent_key") != std::string::npos, message);
  BOOST_CHECK_MESSAGE(message.find("here_key") == std::string::npos, message);
  BOOST_CHECK_MESSAGE(message.find("50 ms") != std::string::npos, message);
  BOOST_TEST(elapsed.count() >= 50); // (how far past: bench/store_suite.cpp, wait_timeout_overrun)
}

// A torn trailing record (a writer died mid-write) is not misparsed: readers
// stop before it and pick it up once complete; a writer cuts it off.
BOOST_AUTO_TEST_CASE(torn_trailing_record_is_ignored, *utf::timeout(30)) {
  temp_file file;
  asio::io_context ctx;
  auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  corodist::test::run_coro(ctx, s->set("a", "1"));
  corodist::test::run_coro(ctx, s->set("b", "22"));

  // Half a header: the op byte and two bytes of the key length.
  append_raw(file.path, set_record("torn", "x").substr(0, 3));
  {
    auto fresh = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
    auto a = corodist::test::run_coro(ctx, fresh->get("a"));
    auto b = corodist::test::run_coro(ctx, fresh->get("b"));
    auto n = corodist::test::run_coro(ctx, fresh->num_keys());
    BOOST_TEST(a == "1");
    BOOST_TEST(b == "22");
    BOOST_TEST(n == 2);
  }
  auto n_old = corodist::test::run_coro(ctx, s->num_keys());
  BOOST_TEST(n_old == 2);

  // Complete that record by hand: readers now see it.
  append_raw(file.path, set_record("torn", "x").substr(3));
  auto torn = corodist::test::run_coro(ctx, s->get("torn"));
  BOOST_TEST(torn == "x");

  // A full header whose value is cut short, then a write through the store:
  // the writer drops the torn bytes, so its record and everything before parse.
  std::string partial = set_record("lost", "0123456789");
  append_raw(file.path, partial.substr(0, partial.size() - 4));
  std::vector<std::string> lost_key;
  lost_key.push_back("lost");
  auto has_lost = corodist::test::run_coro(ctx, s->check(lost_key));
  BOOST_TEST(!has_lost);
  auto c = corodist::test::run_coro(ctx, s->add("c", 5));
  BOOST_TEST(c == 5);

  auto fresh = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  auto keys = corodist::test::run_coro(ctx, fresh->list_keys());
  std::vector<std::string> expected{"a", "b", "c", "torn"};
  BOOST_TEST(keys == expected, boost::test_tools::per_element());
  auto c_again = corodist::test::run_coro(ctx, fresh->get("c"));
  BOOST_TEST(c_again == "5");
}

// A watch sees every change another process makes, in order, even when the
// changes land within one poll interval (the log is replayed, not diffed).
BOOST_AUTO_TEST_CASE(watch_sees_rapid_changes_from_other_process, *utf::timeout(30)) {
  temp_file file;
  pipe_pair go;
  child_process child([&]() -> int {
    go.close_write();
    char byte = 0;
    if (!read_all(go.read_end(), &byte, 1))
      return 2;
    asio::io_context ctx;
    auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
    run_in_child(ctx, [](std::shared_ptr<cs::file_store> s) -> asio::awaitable<int> {
      co_await s->set("w", "1");
      co_await s->set("w", "2");
      co_await s->append("w", "3");
      co_await s->delete_key("w");
      co_await s->set("other", "x");
      co_return 0;
    }(s));
    return 0;
  });
  go.close_read();

  asio::io_context ctx;
  auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
  corodist::test::run_coro(ctx, s->set("w", "before")); // history: not an event
  auto events = corodist::test::run_coro(ctx, [](std::shared_ptr<cs::file_store> s, int go_fd)
                                                  -> asio::awaitable<std::vector<watch_event>> {
    auto stream = co_await s->watch_key("w");
    char byte = 'g';
    if (!write_all(go_fd, &byte, 1))
      throw std::runtime_error("cannot start the child");
    std::vector<watch_event> got;
    for (int i = 0; i < 4; ++i) {
      auto e = co_await stream.next(10s);
      got.push_back(std::move(e));
    }
    co_return got;
  }(s, go.write_end()), 20s);
  BOOST_TEST(child.wait() == 0);

  BOOST_REQUIRE(events.size() == 4u);
  BOOST_TEST((events[0].type == watch_event::kind::updated));
  BOOST_TEST(events[0].value == "1");
  BOOST_TEST((events[1].type == watch_event::kind::updated));
  BOOST_TEST(events[1].value == "2");
  BOOST_TEST((events[2].type == watch_event::kind::updated));
  BOOST_TEST(events[2].value == "23");
  BOOST_TEST((events[3].type == watch_event::kind::deleted));
  BOOST_TEST(events[3].value == "");
  for (const auto& e : events)
    BOOST_TEST(e.key == "w");
}

// Two file_stores in one process, on two threads, exclude each other too
// (classic per-process fcntl locks would not, and would lose updates).
BOOST_AUTO_TEST_CASE(concurrent_add_across_threads_of_one_process, *utf::timeout(60)) {
  temp_file file;
  auto worker = [&](std::vector<std::int64_t>& got, std::exception_ptr& error) {
    try {
      asio::io_context ctx;
      auto s = std::make_shared<cs::file_store>(ctx.get_executor(), file.path);
      run_in_child(ctx, add_many(s, got));
    } catch (...) {
      error = std::current_exception();
    }
  };
  std::vector<std::int64_t> got1, got2;
  std::exception_ptr error1, error2;
  std::thread t1(worker, std::ref(got1), std::ref(error1));
  std::thread t2(worker, std::ref(got2), std::ref(error2));
  t1.join();
  t2.join();
  BOOST_REQUIRE(!error1);
  BOOST_REQUIRE(!error2);

  std::set<std::int64_t> all(got1.begin(), got1.end());
  all.insert(got2.begin(), got2.end());
  BOOST_TEST(all.size() == static_cast<std::size_t>(2 * adds_per_worker));
  BOOST_TEST(*all.rbegin() == 2 * adds_per_worker);
}

BOOST_AUTO_TEST_SUITE_END()
