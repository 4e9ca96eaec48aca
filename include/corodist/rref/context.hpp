#pragma once
/// \file
/// corodist::rref::enable: turning RRefs on for an RPC agent, its options,
/// methods on RRef values, and what the protocol holds (introspection).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/callable_traits.hpp>
#include <corodist/rref/rref.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

namespace corodist::rref {

using namespace std::chrono_literals;

/// Settings of a worker's RRef protocol. Defaults are the named constants.
struct context_options {
  static constexpr std::chrono::milliseconds default_timeout = 60s;
  static constexpr std::chrono::milliseconds default_first_retry = 50ms;
  static constexpr std::chrono::milliseconds default_max_retry_interval = 2s;
  static constexpr std::chrono::milliseconds default_give_up_after = 60s;

  /// Time limit of to_here() and of remote()'s call when none is given
  /// (`inherit()`: default_timeout; `never()`: none).
  corodist::timeout timeout = default_timeout;
  /// A control message not yet acknowledged is sent again after this, then
  /// after twice as long, ... up to max_retry_interval.
  std::chrono::milliseconds first_retry = default_first_retry;
  std::chrono::milliseconds max_retry_interval = default_max_retry_interval;
  /// Retries to a worker stop after this long without an acknowledgement from
  /// it (a dead worker is not a transient failure): logged once, then dropped
  /// (`never()`: retried for ever; `inherit()`: default_give_up_after).
  corodist::timeout give_up_after = default_give_up_after;
};

/// What one worker's protocol holds (PyTorch's _rref_context_get_debug_info).
struct debug_info {
  std::size_t owners = 0;           ///< OwnerRRefs (values held here)
  std::size_t users = 0;            ///< UserRRefs here that the owner knows
  std::size_t pending_users = 0;    ///< UserRRefs here the owner has not confirmed yet
  std::size_t pending_children = 0; ///< forks made here whose receiver has not been confirmed (G2 holds)
  std::size_t forks = 0;            ///< UserRRefs elsewhere known to this worker's owners
  std::size_t unacked = 0;          ///< control messages sent and not yet acknowledged
};

/// Turns RRefs on for `a` (before `a.start()`; throws usage_error after, or if
/// already enabled): message handlers, the retry timer, and a step in graceful
/// shutdown that deletes every UserRRef here and waits until no OwnerRRef here
/// is referenced from another worker (within the time the agent's shutdown
/// gives it; what is still held is logged by RRefId, nothing is thrown).
/// OwnerRRefs that only this worker's own handles hold are the application's:
/// not waited for, they keep their value until their last handle goes.
void enable(rpc::agent& a, context_options opts = {});

/// What `a`'s protocol holds now (any thread; waits for the loop).
debug_info info(rpc::agent& a);

namespace detail {
template <typename T, typename F, typename Params>
struct method_wrapper;
template <typename T, typename F, typename V, typename... A>
struct method_wrapper<T, F, std::tuple<V, A...>> {
  static auto make(F f) {
    static_assert(std::is_same_v<V, T>, "rref::register_method<T>: the method's first parameter must be T& (or const T&)");
    return [f = std::move(f)](const rref<T>& r, A... args) {
      auto p = r.handle()->protocol_of("a method call");
      return p->local_slot(*r.handle())->template with<T>(&p->port(), p->self(),
                                                            [&](T& value) { return f(value, std::move(args)...); });
    };
  }
};
} // namespace detail

/// Registers `f(T& value, args...)` on `a` (before start) as function `name`:
/// `r.rpc_sync<R>(name, args...)` on an rref<T> runs it on r's owner with the
/// value itself. Calls on one value take turns (its lock is held while `f`
/// runs); calls on different values run in parallel on the worker pool.
template <typename T, typename F>
void register_method(rpc::agent& a, std::string name, F f) {
  using params = typename rpc::callable_traits<F>::params;
  a.register_function(std::move(name), detail::method_wrapper<T, F, params>::make(std::move(f)));
}

} // namespace corodist::rref
