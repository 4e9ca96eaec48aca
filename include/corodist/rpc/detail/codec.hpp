#pragma once
/// \file
/// The templates of the RPC codec that calls and registrations instantiate in
/// user code: packing arguments and results, decoding results, turning a
/// registered callable into a handler, and the msgpack adaptors of
/// rpc::attachment. Everything that need not be a template lives in src/rpc/.
///
/// Call body: `[function name, [args...], timeout_ms]` (0: no deadline).
/// An attachment inside a body is msgpack ext type 0x41 whose 4 bytes are a
/// little-endian index into the payload's attachment table.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/rpc/attachment.hpp>
#include <corodist/rpc/call_context.hpp>
#include <corodist/rpc/codec_context.hpp>
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

/// msgpack ext type that marks an attachment reference (body: u32 index).
inline constexpr std::int8_t attachment_ext_type = 0x41;

/// Packs one payload: a msgpack stream writer whose codec_context (current
/// while it lives) collects the attachments and upper layers' records.
class encoder {
public:
  /// `port`, `self`, `peer`: what the codec_context tells adaptors.
  encoder(message_port* port = nullptr, int self = -1, int peer = -1);
  ~encoder() = default;
  encoder(const encoder&) = delete;
  encoder& operator=(const encoder&) = delete;

  /// msgpack's stream interface.
  void write(const char* p, std::size_t n) {
    const auto* b = reinterpret_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  /// The packer to write the body with.
  msgpack::packer<encoder>& packer() noexcept { return packer_; }
  /// Completes the payload (prefix, attachment table). Throws usage_error if
  /// the body passes 4 GiB.
  payload finish();

private:
  net::bytes out_;
  codec_context ctx_;
  codec_scope scope_;
  msgpack::packer<encoder> packer_;
};

/// A received payload, parsed: the msgpack body (referencing the payload, which
/// the context's `in_owner` keeps alive); the attachments went to the context.
struct parsed_payload {
  msgpack::object_handle body;
  std::shared_ptr<const void> owner;
};

/// Parses a payload into `ctx` (in_owner, in_attachments) and the body. Bounded
/// in time and memory by the payload: lengths are checked against it, and the
/// body may decode into at most max(4 x its size, 16 MiB) of msgpack objects
/// (counted before any is made). Throws protocol_error saying what is wrong.
/// The fuzzing entry point of the RPC decoder.
parsed_payload parse_payload(net::bytes&& payload, codec_context& ctx);

/// The demangled name of a type (for error messages).
std::string demangle(const char* mangled);

/// The name of a msgpack object type ("str", "positive integer", ...).
std::string type_name(msgpack::type::object_type t);

/// Thrown while decoding arguments; becomes a bad_arguments reply.
class argument_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Thrown when a result does not decode to the caller's type.
class result_type_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Packs one argument; C strings and string views as msgpack str.
template <typename T>
void pack_arg(msgpack::packer<encoder>& pk, const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view> && !std::is_same_v<T, std::string>) {
    const std::string_view s(v);
    pk.pack_str(static_cast<std::uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
  } else {
    pk.pack(v);
  }
}

/// Encodes a call body `[fn, [args...], timeout_ms]` with `e`.
template <typename... A>
payload encode_call(encoder& e, std::string_view fn, std::uint64_t timeout_ms, const A&... args) {
  auto& pk = e.packer();
  pk.pack_array(3);
  pack_arg(pk, fn);
  pk.pack_array(static_cast<std::uint32_t>(sizeof...(A)));
  (pack_arg(pk, args), ...);
  pk.pack(timeout_ms);
  return e.finish();
}

/// Encodes a result value (nil for void) with `e`.
template <typename T>
payload encode_value(encoder& e, const T& v) {
  pack_arg(e.packer(), v);
  return e.finish();
}
payload encode_nil(encoder& e);

/// Converts a decoded result body to R. Throws result_type_error saying what
/// was received instead.
template <typename R>
R decode_result(const msgpack::object& o) {
  if constexpr (!std::is_void_v<R>) {
    try {
      return o.as<R>();
    } catch (const std::exception& e) {
      throw result_type_error("the result (msgpack " + type_name(o.type) + ") does not decode to " +
                              demangle(typeid(R).name()) + " (" + e.what() + ")");
    }
  }
}

// ---- function traits --------------------------------------------------------

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
      throw argument_error("argument " + std::to_string(i) + " (msgpack " + type_name(a.type) +
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
  corodist::detail::unique_function<payload()> plain;
  asio::awaitable<payload> coro;
};
using result_encoder = std::function<std::unique_ptr<encoder>()>;
using handler = std::function<bound_call(const msgpack::object& args, call_context ctx, result_encoder enc)>;

template <typename F, typename Tuple>
asio::awaitable<payload> run_coroutine_function(std::shared_ptr<F> f, Tuple args, result_encoder enc) {
  using T = typename awaitable_value<typename callable_traits<F>::result>::type;
  if constexpr (std::is_void_v<T>) {
    co_await std::apply(*f, std::move(args));
    co_return encode_nil(*enc());
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
          return encode_nil(*enc());
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

// ---- msgpack adaptors for rpc::attachment -----------------------------------

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <>
  struct pack<corodist::rpc::attachment> {
    template <typename Stream>
    msgpack::packer<Stream>& operator()(msgpack::packer<Stream>& o, const corodist::rpc::attachment& a) const {
      auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::encode)
        throw corodist::usage_error("rpc::attachment can only be packed as part of an RPC message");
      const auto idx = static_cast<std::uint32_t>(ctx->out_attachments.size());
      ctx->out_attachments.push_back(corodist::net::segment{a.owner(), asio::const_buffer(a.data(), a.size())});
      std::byte b[4];
      corodist::net::detail::store_le(b, idx);
      o.pack_ext(4, corodist::rpc::detail::attachment_ext_type);
      o.pack_ext_body(reinterpret_cast<const char*>(b), 4);
      return o;
    }
  };

  template <>
  struct convert<corodist::rpc::attachment> {
    const msgpack::object& operator()(const msgpack::object& o, corodist::rpc::attachment& v) const {
      if (o.type != msgpack::type::EXT || o.via.ext.type() != corodist::rpc::detail::attachment_ext_type ||
          o.via.ext.size != 4)
        throw msgpack::type_error();
      const auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::decode)
        throw msgpack::type_error();
      const auto idx =
          corodist::net::detail::load_le<std::uint32_t>(reinterpret_cast<const std::byte*>(o.via.ext.data()));
      if (idx >= ctx->in_attachments.size())
        throw msgpack::type_error();
      v = corodist::rpc::attachment(ctx->in_owner, ctx->in_attachments[idx]);
      return o;
    }
  };

  } // namespace adaptor
} // MSGPACK_API_VERSION_NAMESPACE
} // namespace msgpack
