#pragma once
/// \file
/// corodist::rpc::callable_traits: the result and parameter types of a
/// callable, as register_function reads them (and layers above that wrap
/// functions, as rref::register_method).

#include <corodist/core/config.hpp>

#include <tuple>
#include <type_traits>

namespace corodist::rpc {

/// `result`: what F returns; `params`: a std::tuple of its parameter types,
/// decayed. For function pointers, functions, and classes with one
/// (non-template) operator() -- lambdas.
template <typename T>
struct callable_traits : callable_traits<decltype(&T::operator())> {};
template <typename R, typename... A>
struct callable_traits<R (*)(A...)> {
  using result = R;
  using params = std::tuple<std::decay_t<A>...>;
};
template <typename R, typename... A>
struct callable_traits<R (*)(A...) noexcept> : callable_traits<R (*)(A...)> {};
template <typename R, typename... A>
struct callable_traits<R(A...)> : callable_traits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct callable_traits<R (C::*)(A...)> : callable_traits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct callable_traits<R (C::*)(A...) const> : callable_traits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct callable_traits<R (C::*)(A...) noexcept> : callable_traits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct callable_traits<R (C::*)(A...) const noexcept> : callable_traits<R (*)(A...)> {};

} // namespace corodist::rpc
