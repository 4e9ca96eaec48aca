#pragma once
// Test fixtures of the RPC suite: options for worker `rank`, a standard set of
// functions, and an in-process cluster of agents (one event loop each) over a
// shared in-memory store.

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/hash_store.hpp>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace corodist::test {

using namespace std::chrono_literals;

/// A user type that crosses the wire through msgpack's adaptors.
struct point {
  int x = 0;
  double y = 0;
  std::string label;
  std::vector<int> tags;
  rpc::attachment blob;
  MSGPACK_DEFINE(x, y, label, tags, blob);
};

/// A user exception type (its name must come back in remote_error::type()).
class custom_failure : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

/// Options of worker `rank` ("w<rank>") with test-sized deadlines.
inline rpc::agent_options worker_options(int rank, int world, std::shared_ptr<store::store> s) {
  rpc::agent_options o;
  o.name = "w" + std::to_string(rank);
  o.rank = rank;
  o.world_size = world;
  o.store = std::move(s);
  o.rpc_timeout = 30s;
  o.init_timeout = 20s;
  o.shutdown_timeout = 20s;
  o.auth_token = "";
  return o;
}

/// What the sleeping test functions report: how many calls have entered and
/// left them, for tests that must wait until a call is running (or done) on
/// its callee -- an event, not a guess at how long that takes.
class call_log {
public:
  /// A call entered / left a sleeping function.
  void enter() { bump(entries_); }
  void leave() { bump(exits_); }
  /// Calls that entered / left so far (tests wait for their own on top of these).
  int entries() {
    std::lock_guard lk(m_);
    return entries_;
  }
  int exits() {
    std::lock_guard lk(m_);
    return exits_;
  }
  /// Waits until `total` calls have entered (false after `limit`).
  bool wait_entries(int total, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return wait(entries_, total, limit);
  }
  /// Waits until `total` calls have left (false after `limit`).
  bool wait_exits(int total, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return wait(exits_, total, limit);
  }

private:
  void bump(int& counter) {
    {
      std::lock_guard lk(m_);
      ++counter;
    }
    cv_.notify_all();
  }
  bool wait(int& counter, int total, std::chrono::milliseconds limit) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, limit, [&] { return counter >= total; });
  }
  std::mutex m_;
  std::condition_variable cv_;
  int entries_ = 0;
  int exits_ = 0;
};

/// The log of one process's sleeping test functions.
inline call_log& sleeps() {
  static call_log log;
  return log;
}

/// Where the "hold" test function waits: closed, it holds every call until a
/// test opens it -- a call that must still be running at some point of a
/// test is held there, not given a long sleep and hoped to last.
class hold_gate {
public:
  /// Holds the calls that come from now on.
  void close() {
    std::lock_guard lk(m_);
    open_ = false;
  }
  /// Lets every held call go, and the later ones through.
  void open() {
    {
      std::lock_guard lk(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  /// Waits until open (false after `limit`: a test that forgot to open it).
  bool pass(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, limit, [&] { return open_; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = true;
};

/// The gate of one process's "hold" calls.
inline hold_gate& holds() {
  static hold_gate gate;
  return gate;
}

/// Registers the functions every test worker offers.
inline void register_standard(rpc::agent& a, const std::string& name) {
  a.register_function("add", [](int x, int y) { return x + y; });
  a.register_function("whoami", [name] { return name; });
  a.register_function("nothing", [] {});
  a.register_function("concat", [](const std::string& x, const std::string& y) { return x + y; });
  a.register_function("make_string", [](std::size_t n) { return std::string(n, 'z'); });
  a.register_function("echo_att", [](rpc::attachment b) { return b; });
  a.register_function("att_size", [](const rpc::attachment& b) { return b.size(); });
  a.register_function("move_point", [](point p, int dx) {
    p.x += dx;
    p.label += "!";
    return p;
  });
  // The work of a function that takes `ms` (a stand-in for real work: how long
  // it runs is what a test sets against a deadline or a shutdown; a test that
  // needs a call still running at some point holds it with "hold" instead).
  a.register_function("sleep_ms", [](int ms) {
    sleeps().enter();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    sleeps().leave();
    return ms;
  });
  a.register_function("co_sleep_ms", [](int ms) -> asio::awaitable<int> {
    sleeps().enter();
    struct on_exit {
      ~on_exit() { sleeps().leave(); }
    } leaving;
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
    co_await t.async_wait(asio::use_awaitable);
    co_return ms;
  });
  // Runs until the test opens holds() (logged in sleeps()); returns `v`.
  a.register_function("hold", [](int v) {
    sleeps().enter();
    const bool opened = holds().pass();
    sleeps().leave();
    if (!opened)
      throw std::runtime_error("hold: the test never opened the gate");
    return v;
  });
  a.register_function("co_add", [](int x, int y) -> asio::awaitable<int> { co_return x + y; });
  a.register_function("fail", [](const std::string& msg) -> int { throw std::runtime_error(msg); });
  a.register_function("fail_custom", [](const std::string& msg) { throw custom_failure(msg); });
  a.register_function("co_fail", [](std::string msg) -> asio::awaitable<void> {
    throw std::invalid_argument(msg);
    co_return;
  });
  // Nested calls: a coroutine that calls another worker, and a blocking one.
  a.register_function("co_relay", [&a](std::string to, int x) -> asio::awaitable<int> {
    co_return co_await a.call<int>(to, "add", x, 1);
  });
  a.register_function("relay", [&a](const std::string& to, int x) { return a.rpc_sync<int>(to, "add", x, 1); });
}

/// The body of worker `rank` of `world` in a multi-process job (a child
/// process; no Boost.Test there): an agent on `loop` (started) meeting the
/// others at `s` and listening on `host`, calls every worker, itself
/// included, synchronously, asynchronously and through a third worker, and
/// has each throw (a remote_error naming the worker and the message); then
/// shuts down gracefully. Returns 0, or 2 after printing the wrong answers.
inline int call_everyone(event_loop& loop, std::shared_ptr<store::store> s, int rank, int world,
                         const std::string& host = "127.0.0.1") {
  auto o = worker_options(rank, world, std::move(s));
  o.host = host;
  rpc::agent a(loop, o);
  register_standard(a, o.name);
  a.start();
  int bad = 0;
  for (int to = 0; to < world; ++to) {
    const std::string name = "w" + std::to_string(to);
    bad += a.rpc_sync<int>(to, "add", rank, to) != rank + to;
    bad += a.rpc_sync<std::string>(name, "whoami") != name;
    std::vector<corodist::future<int>> fs;
    for (int i = 0; i < 200; ++i)
      fs.push_back(a.rpc_async<int>(name, i % 2 ? "co_add" : "add", i, rank));
    for (int i = 0; i < 200; ++i)
      bad += fs[static_cast<std::size_t>(i)].get() != i + rank;
    const std::string third = "w" + std::to_string((to + 1) % world);
    bad += a.rpc_sync<int>(name, "relay", third, rank) != rank + 1;
    bad += a.rpc_sync<int>(name, "co_relay", third, rank) != rank + 1;
    try {
      a.rpc_sync<int>(name, "fail", std::string("boom from ") + o.name);
      ++bad;
    } catch (const remote_error& e) {
      bad += e.worker() != name || e.message() != "boom from " + o.name;
    }
  }
  a.shutdown();
  if (bad)
    std::fprintf(stderr, "worker %d: %d wrong answers\n", rank, bad);
  return bad == 0 ? 0 : 2;
}

/// `n` agents "w0".."w<n-1>" in this process, each on its own event loop,
/// sharing a hash_store. Agents are destroyed (without shutdown unless the
/// test did it) before their loops.
struct cluster {
  explicit cluster(int n, const std::function<void(rpc::agent_options&)>& tweak = {}, bool start = true) {
    store_loop.start();
    store = std::make_shared<store::hash_store>(store_loop.get_executor());
    store->set_timeout(20s);
    for (int r = 0; r < n; ++r) {
      loops.push_back(std::make_unique<event_loop>());
      loops.back()->start();
      auto o = worker_options(r, n, store);
      if (tweak)
        tweak(o);
      agents.push_back(std::make_unique<rpc::agent>(*loops.back(), o));
      register_standard(*agents.back(), o.name);
    }
    if (start)
      start_all();
  }
  ~cluster() {
    agents.clear();
    loops.clear();
  }

  /// Starts every agent (each waits for all the others), from threads.
  void start_all() {
    for_each_agent([](rpc::agent& a, int) { a.start(); });
  }

  /// Shuts every agent down gracefully, concurrently.
  void shutdown_all() {
    for_each_agent([](rpc::agent& a, int) { a.shutdown(); });
  }

  /// Runs `f(agent, rank)` on one thread per agent; rethrows the first failure.
  void for_each_agent(const std::function<void(rpc::agent&, int)>& f) {
    std::vector<std::thread> ts;
    std::vector<std::exception_ptr> errors(agents.size());
    for (std::size_t i = 0; i < agents.size(); ++i)
      ts.emplace_back([&, i] {
        try {
          f(*agents[i], static_cast<int>(i));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    for (auto& t : ts)
      t.join();
    for (auto& e : errors)
      if (e)
        std::rethrow_exception(e);
  }

  rpc::agent& operator[](int r) { return *agents[static_cast<std::size_t>(r)]; }

  event_loop store_loop;
  std::shared_ptr<store::hash_store> store;
  std::vector<std::unique_ptr<event_loop>> loops;
  std::vector<std::unique_ptr<rpc::agent>> agents;
};

} // namespace corodist::test
