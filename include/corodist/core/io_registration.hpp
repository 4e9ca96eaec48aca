#pragma once
/// \file
/// corodist::io_registration: keeps one I/O object on its context's
/// close-at-shutdown list (src/core/io_registry.hpp) for as long as it lives.

#include <corodist/core/config.hpp>

#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <functional>

namespace corodist {

namespace detail {
class io_registry;
} // namespace detail

/// Registers `close(final)` with the io_registry of a context: called with
/// final = false when an event_loop drains, and with final = true when the
/// context shuts down (the registration is then void). Unregisters on
/// destruction. Declare it as the owner's last member, so it goes first.
/// Construct and destroy on any thread; `close` runs on the context's thread.
class io_registration {
public:
  io_registration(asio::execution_context& ctx, std::function<void(bool final)> close);

  /// The registration for the context `ex` belongs to.
  template <typename Executor>
  io_registration(const Executor& ex, std::function<void(bool final)> close)
      : io_registration(asio::query(ex, asio::execution::context), std::move(close)) {}

  ~io_registration();
  io_registration(const io_registration&) = delete;
  io_registration& operator=(const io_registration&) = delete;

private:
  detail::io_registry* registry_; // null once the context has shut down
};

} // namespace corodist
