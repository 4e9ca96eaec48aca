#pragma once
// Helpers of the cancellation tests: spawn an awaitable with a cancellation
// signal's slot bound and learn how it ended, and check that it ended as a
// cancelled operation does (a std::system_error with operation_aborted).

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/awaitable.hpp>
#include <asio/error.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <typeinfo>

namespace corodist::test {

/// A completion token for an operation's `async_...(token)` form: bound to
/// `signal`'s slot (`signal.emit(type)` on `ex`'s thread asks for a
/// cancellation of that type) and run on `ex`; `ended` then holds how the
/// operation ended (null: it completed; its value, if any, is dropped). Use
/// it on `ex`'s thread (a slot is not thread-safe).
template <typename Executor>
auto cancellable_token(const Executor& ex, asio::cancellation_signal& signal, std::future<std::exception_ptr>& ended) {
  auto p = std::make_shared<std::promise<std::exception_ptr>>();
  ended = p->get_future();
  return asio::bind_cancellation_slot(signal.slot(),
                                      asio::bind_executor(ex, [p](std::exception_ptr e, auto&&...) { p->set_value(e); }));
}

/// Spawns the coroutine `op` on `ex` with cancellable_token: a coroutine
/// lets only terminal cancellation through unless it enables more (see
/// docs/core.md). The future holds how it ended. Call it on `ex`'s thread.
template <typename Executor, typename T>
std::future<std::exception_ptr> spawn_cancellable(const Executor& ex, asio::awaitable<T> op,
                                                  asio::cancellation_signal& signal) {
  std::future<std::exception_ptr> ended;
  asio::co_spawn(ex, std::move(op), cancellable_token(ex, signal, ended));
  return ended;
}

/// "" when `e` is how a cancelled operation ends: a std::system_error with
/// asio::error::operation_aborted; otherwise what it was instead. Usable
/// where Boost.Test is not (a forked rank process).
inline std::string not_operation_aborted(std::exception_ptr e) {
  if (!e)
    return "it completed instead of ending cancelled";
  try {
    std::rethrow_exception(e);
  } catch (const std::system_error& err) {
    if (err.code() == asio::error::operation_aborted)
      return {};
    return std::string("expected operation_aborted, got a system_error: ") + err.what();
  } catch (const std::exception& other) {
    return std::string("expected operation_aborted, got ") + typeid(other).name() + ": " + other.what();
  } catch (...) {
    return "expected operation_aborted, got something not a std::exception";
  }
}

/// Checks that `e` is the end of a cancelled operation (not_operation_aborted).
inline void check_operation_aborted(std::exception_ptr e) {
  const auto why = not_operation_aborted(e);
  BOOST_TEST(why.empty(), why);
}

/// Waits up to `limit` for `ended` (spawn_cancellable's future), then checks
/// that the operation ended cancelled.
inline void require_cancelled(std::future<std::exception_ptr>& ended,
                              std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  BOOST_REQUIRE_MESSAGE(ended.wait_for(limit) == std::future_status::ready,
                        "the cancelled operation did not end within " << limit.count() << " ms");
  check_operation_aborted(ended.get());
}

} // namespace corodist::test
