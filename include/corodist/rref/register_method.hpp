#pragma once
/// \file
/// corodist::rref::register_method: a function that runs on an RRef's value
/// at its owner.

#include <corodist/core/config.hpp>

#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/callable_traits.hpp>
#include <corodist/rref/rref.hpp>

#include <string>
#include <tuple>
#include <type_traits>

namespace corodist::rref {

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
