#pragma once
// Fixtures of the Gloo tests: ranks as threads of this process over one
// in-memory store, and the options every test group uses (loopback, short deadlines).

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include <boost/test/unit_test.hpp>

#include "support/on_threads.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

/// Assertion for rank bodies run on threads (Boost.Test's are for the main
/// thread only): throws, and thread_ranks::run reports it for the rank.
#define RANK_REQUIRE(cond)                                                                                            \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": failed: " #cond);             \
  } while (0)

namespace corodist::test {

/// Precondition of the Gloo test suites: this build has the Gloo backend.
inline boost::test_tools::assertion_result gloo_built(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(collective::gloo_group::built());
  if (!r)
    r.message() << "skipped: corodist was built without Gloo (libgloo-dev not found)";
  return r;
}

/// Fails the test for each rank body that did not return normally
/// (`thread_ranks::run`'s result: "" for a rank that did).
inline void require_all_ok(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    BOOST_TEST(e.empty(), e);
}

/// Throws unless `f()` throws an `E`; returns E's message.
template <typename E, typename F>
std::string require_throws(F&& f, const std::string& what) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": threw another type: " + e.what());
  }
  throw std::runtime_error(what + ": did not throw");
}

/// Loopback, a deadline well inside the test timeouts, and `prefix`.
inline collective::gloo_options gloo_test_options(std::string prefix = "test/pg",
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  collective::gloo_options o;
  o.host = "127.0.0.1";
  o.prefix = std::move(prefix);
  o.timeout = timeout;
  return o;
}

/// A client on `loop` of the test's store server on `host`:`port` (rank processes meet there).
inline std::shared_ptr<store::store> connect_test_store(event_loop& loop, std::uint16_t port,
                                                        const std::string& host = "127.0.0.1") {
  store::tcp_store_options o;
  o.host = host;
  o.port = port;
  o.auth_token = "";
  o.timeout = std::chrono::seconds(20);
  return store::tcp_store::connect_sync(loop.get_executor(), o);
}

/// A count of events that threads wait for, with a deadline.
class countdown {
public:
  explicit countdown(int n) : left_(n) {}
  void arrive() {
    std::lock_guard lk(m_);
    if (--left_ <= 0)
      cv_.notify_all();
  }
  /// True once every event arrived, false after `timeout`.
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, timeout, [&] { return left_ <= 0; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int left_;
};

/// Ranks as threads: one event loop and one hash_store shared by all.
struct thread_ranks {
  thread_ranks() {
    loop.start();
    store = std::make_shared<store::hash_store>(loop.get_executor());
  }

  /// Runs `body(rank)` on `n` threads at once; returns each rank's error
  /// ("" when it returned normally).
  std::vector<std::string> run(int n, const std::function<void(int)>& body) { return run_on_threads(n, body); }

  /// Creates rank `r` of `n` of a group with `opts`.
  std::shared_ptr<collective::gloo_group> group(int r, int n, collective::gloo_options opts = gloo_test_options()) {
    return collective::gloo_group::create_sync(store, r, n, std::move(opts));
  }

  event_loop loop;
  std::shared_ptr<store::hash_store> store;
};

} // namespace corodist::test
