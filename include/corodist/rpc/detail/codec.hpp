#pragma once
/// \file
/// The templates of rpc/'s own calls, private to rpc/ (layers above use
/// codec.hpp): encoding a call, decoding its arguments, and turning a
/// registered callable into a handler. Everything that need not be a template
/// lives in src/rpc/.
///
/// Call body: `[function name, [args...], timeout_ms]` (0: no deadline),
/// with a 4th element `{key: value}` (strings) when the call has metadata.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/timeout.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/call_context.hpp>
#include <corodist/rpc/callable_traits.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/payload.hpp>

#include <asio/awaitable.hpp>

#include <msgpack.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace corodist::rpc::detail {

/// Thrown while decoding arguments; becomes a bad_arguments reply.
class argument_error : public error {
public:
  using error::error;
};

/// Encodes a call body `[fn, [args...], timeout_ms]` with `e`; timeout_ms
/// is `by`'s wire form (the time remaining; 0: none); `metadata`, when given
/// and not empty, as a 4th element (the caller has checked its size).
template <typename... A>
payload encode_call_with_metadata(encoder& e, std::string_view fn, corodist::deadline by,
                                  const call_metadata* metadata, const A&... args) {
  auto& pk = e.packer();
  const bool with_metadata = metadata && !metadata->empty();
  pk.pack_array(with_metadata ? 4 : 3);
  pack_value(pk, fn);
  pk.pack_array(static_cast<std::uint32_t>(sizeof...(A)));
  (pack_value(pk, args), ...);
  pk.pack(by.to_wire());
  if (with_metadata) {
    pk.pack_map(static_cast<std::uint32_t>(metadata->size()));
    for (const auto& [k, v] : *metadata) {
      pk.pack(k);
      pk.pack(v);
    }
  }
  return e.finish();
}

/// As above, without metadata.
template <typename... A>
payload encode_call(encoder& e, std::string_view fn, corodist::deadline by, const A&... args) {
  return encode_call_with_metadata(e, fn, by, nullptr, args...);
}

template <typename T>
struct awaitable_value {
  static constexpr bool is_awaitable = false;
  using type = T;
};
template <typename T, typename E>
struct awaitable_value<asio::awaitable<T, E>> {
  static constexpr bool is_awaitable = true;
  using type = T;
};

/// True for types that only view memory they do not own: a received value of
/// such a type would point into a buffer that is gone when the function runs
/// (or into freed memory when a result is sent).
template <typename T>
struct is_non_owning : std::bool_constant<std::is_pointer_v<T>> {};
template <typename C, typename Tr>
struct is_non_owning<std::basic_string_view<C, Tr>> : std::true_type {};
template <typename T, std::size_t N>
struct is_non_owning<std::span<T, N>> : std::true_type {};
template <typename T>
struct is_non_owning<std::reference_wrapper<T>> : std::true_type {};
template <typename T, typename A>
struct is_non_owning<std::vector<T, A>> : is_non_owning<T> {};
template <typename T>
struct is_non_owning<std::optional<T>> : is_non_owning<T> {};
template <typename A, typename B>
struct is_non_owning<std::pair<A, B>> : std::bool_constant<is_non_owning<A>::value || is_non_owning<B>::value> {};
template <typename... T>
struct is_non_owning<std::tuple<T...>> : std::bool_constant<(is_non_owning<T>::value || ...)> {};

/// Whether the first parameter is the injected call_context.
template <typename Params>
struct takes_call_context : std::false_type {};
template <typename... Rest>
struct takes_call_context<std::tuple<call_context, Rest...>> : std::true_type {};

/// The parameters that come from the wire (without an injected call_context).
template <typename Params>
struct wire_params {
  using type = Params;
};
template <typename... Rest>
struct wire_params<std::tuple<call_context, Rest...>> {
  using type = std::tuple<Rest...>;
};

/// Decodes the arguments array `o` into `Tuple`. Throws argument_error naming
/// the argument that does not fit.
template <typename Tuple, std::size_t... I>
Tuple decode_args(const msgpack::object& o, std::index_sequence<I...>) {
  constexpr std::size_t n = sizeof...(I);
  if (o.type != msgpack::type::ARRAY)
    throw argument_error("the arguments are not an array");
  if (o.via.array.size != n)
    throw argument_error("expected " + std::to_string(n) + " argument(s), got " + std::to_string(o.via.array.size));
  Tuple t;
  auto one = [&](const msgpack::object& a, auto& v, std::size_t i) {
    try {
      a.convert(v);
    } catch (const std::exception& e) {
      throw argument_error("argument " + std::to_string(i) + " (msgpack " + msgpack_type_name(a.type) +
                           ") does not decode to " + demangle(typeid(std::decay_t<decltype(v)>).name()) + " (" +
                           e.what() + ")");
    }
  };
  (one(o.via.array.ptr[I], std::get<I>(t), I), ...);
  (void)one; // unused for functions without parameters
  return t;
}

/// A registered function, type-erased. `bind` decodes the arguments (throwing
/// argument_error) and returns the work: for a plain function `plain` (run on
/// the pool; returns the encoded result), for a coroutine function `coro` (run
/// on the loop). `encode` makes the encoder for the result.
struct bound_call {
  corodist::unique_function<payload()> plain;
  asio::awaitable<payload> coro;
};
using result_encoder = std::function<std::unique_ptr<encoder>()>;
using handler = std::function<bound_call(const msgpack::object& args, call_context ctx, result_encoder enc)>;

template <typename F, typename Tuple>
asio::awaitable<payload> run_coroutine_function(std::shared_ptr<F> f, Tuple args, result_encoder enc) {
  using T = typename awaitable_value<typename callable_traits<F>::result>::type;
  if constexpr (std::is_void_v<T>) {
    co_await std::apply(*f, std::move(args));
    co_return nil_payload();
  } else {
    auto v = co_await std::apply(*f, std::move(args));
    co_return encode_value(*enc(), v);
  }
}

/// Builds the handler of callable `f` (shared by every call: a mutable
/// functor keeps its state; plain functions may run concurrently on the pool).
template <typename F>
handler make_handler(F f) {
  using traits = callable_traits<F>;
  using params_t = typename traits::params;
  using result_t = typename awaitable_value<typename traits::result>::type;
  using args_t = typename wire_params<params_t>::type;
  constexpr bool with_context = takes_call_context<params_t>::value;
  static_assert(!is_non_owning<args_t>::value,
                "rpc::register_function: a parameter type only views memory (std::string_view, std::span, a "
                "pointer, or a container of them) -- its bytes would be gone when the function runs. Use an "
                "owning type: std::string for text, std::vector<T> or rpc::attachment for bytes.");
  static_assert(!is_non_owning<result_t>::value,
                "rpc::register_function: the result type only views memory (std::string_view, std::span, a "
                "pointer) -- it would point into freed memory when sent. Return std::string, std::vector<T> or "
                "rpc::attachment.");
  auto shared = std::make_shared<F>(std::move(f));
  return [shared](const msgpack::object& o, call_context ctx, result_encoder enc) -> bound_call {
    constexpr auto seq = std::make_index_sequence<std::tuple_size_v<args_t>>{};
    auto args = [&] {
      if constexpr (with_context)
        return std::tuple_cat(std::make_tuple(std::move(ctx)), decode_args<args_t>(o, seq));
      else
        return decode_args<args_t>(o, seq);
    }();
    bound_call b;
    if constexpr (awaitable_value<typename traits::result>::is_awaitable) {
      b.coro = run_coroutine_function<F, decltype(args)>(shared, std::move(args), std::move(enc));
    } else {
      b.plain = [shared, args = std::move(args), enc = std::move(enc)]() mutable -> payload {
        if constexpr (std::is_void_v<result_t>) {
          std::apply(*shared, std::move(args));
          return nil_payload();
        } else {
          auto e = enc();
          return encode_value(*e, std::apply(*shared, std::move(args)));
        }
      };
    }
    return b;
  };
}

} // namespace corodist::rpc::detail
