#pragma once
/// \file
/// Private to the RPC layer (included by agent.hpp): the payload codec shared
/// by calls and replies, msgpack adaptors for attachments, and the type
/// erasure that turns a registered callable into a handler. Kept to what
/// templates need; everything else lives in src/rpc/.
///
/// Payload of a call or reply frame (little-endian):
///   u32 body_len | u32 attachment_count | body (msgpack) |
///   u64 attachment_len x attachment_count | attachment bytes, in order
/// Attachments are written as extra segments (scatter/gather), never copied.

#include <corodist/core/detail/unique_function.hpp>
#include <corodist/core/error.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/attachment.hpp>

#include <asio/awaitable.hpp>

#include <msgpack.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
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

/// An encoded call or reply: the frame payload's owned part and its attachments.
struct encoded {
  net::bytes body;
  std::vector<net::segment> attachments;
};

/// Attachments collected while packing on this thread (null outside an encoder).
struct encode_context {
  std::vector<net::segment> segments;
};
encode_context*& current_encode() noexcept;

/// Attachments of the payload being decoded on this thread (null outside a decode_scope).
struct decode_context {
  std::shared_ptr<const void> owner;
  std::vector<std::span<const std::byte>> attachments;
};
const decode_context*& current_decode() noexcept;

/// Packs one payload: a msgpack stream writer that collects attachments.
class encoder {
public:
  encoder();
  ~encoder();
  encoder(const encoder&) = delete;
  encoder& operator=(const encoder&) = delete;

  /// msgpack's stream interface.
  void write(const char* p, std::size_t n) {
    const auto* b = reinterpret_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  /// The packer to write the body with.
  msgpack::packer<encoder>& packer() noexcept { return packer_; }
  /// Completes the payload (length prefix, attachment table).
  encoded finish();

private:
  net::bytes out_;
  encode_context ctx_;
  encode_context* prev_;
  msgpack::packer<encoder> packer_;
};

/// A received payload, parsed: the msgpack body (referencing the payload,
/// which `owner` keeps alive) and the attachment views.
struct parsed_payload {
  msgpack::object_handle body;
  decode_context attachments;
};

/// Parses a payload. Throws `protocol_error` if it is malformed.
parsed_payload parse_payload(net::bytes&& payload);

/// Installs `ctx` as this thread's decode context for its lifetime.
class decode_scope {
public:
  explicit decode_scope(const decode_context* ctx) noexcept : prev_(current_decode()) { current_decode() = ctx; }
  ~decode_scope() { current_decode() = prev_; }
  decode_scope(const decode_scope&) = delete;
  decode_scope& operator=(const decode_scope&) = delete;

private:
  const decode_context* prev_;
};

/// The demangled name of a type (for error messages).
std::string demangle(const char* mangled);

/// The name of a msgpack object type ("str", "positive integer", ...).
std::string type_name(msgpack::type::object_type t);

/// Thrown while decoding arguments; becomes a bad_arguments reply.
class argument_error : public std::runtime_error {
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

/// Encodes a call body: [function name, [args...]].
template <typename... A>
encoded encode_call(std::string_view fn, const A&... args) {
  encoder e;
  auto& pk = e.packer();
  pk.pack_array(2);
  pk.pack_str(static_cast<std::uint32_t>(fn.size()));
  pk.pack_str_body(fn.data(), static_cast<std::uint32_t>(fn.size()));
  pk.pack_array(static_cast<std::uint32_t>(sizeof...(A)));
  (pack_arg(pk, args), ...);
  return e.finish();
}

/// Encodes a result value (nil for void).
template <typename T>
encoded encode_value(const T& v) {
  encoder e;
  pack_arg(e.packer(), v);
  return e.finish();
}
encoded encode_nil();

/// Decodes a reply payload into R. Throws `protocol_error` naming `what` if
/// the result does not decode to R.
template <typename R>
R decode_result(net::bytes&& payload, const std::string& what) {
  auto p = parse_payload(std::move(payload));
  if constexpr (std::is_void_v<R>) {
    return;
  } else {
    decode_scope scope(&p.attachments);
    try {
      return p.body.get().as<R>();
    } catch (const std::exception& e) {
      throw protocol_error(what + ": the result does not decode to " + demangle(typeid(R).name()) + " (" + e.what() +
                           ")");
    }
  }
}

// ---- function traits --------------------------------------------------------

template <typename T>
struct callable_traits : callable_traits<decltype(&T::operator())> {};
template <typename R, typename... A>
struct callable_traits<R (*)(A...)> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
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
};
template <typename T, typename E>
struct awaitable_value<asio::awaitable<T, E>> {
  static constexpr bool is_awaitable = true;
  using type = T;
};

/// Decodes the arguments array `o` into `Tuple` (decayed parameter types).
/// Throws argument_error naming the argument that does not fit.
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

/// A registered function, type-erased. `bind` decodes the arguments (on the
/// loop, throwing argument_error) and returns the work: for a plain function
/// `plain` is set (run on the pool; returns the encoded result), for a
/// coroutine function `coro` (run on the loop).
struct bound_call {
  corodist::detail::unique_function<encoded()> plain;
  asio::awaitable<encoded> coro;
};
using handler = std::function<bound_call(const msgpack::object& args)>;

template <typename F, typename Tuple>
asio::awaitable<encoded> run_coroutine_function(F f, Tuple args) {
  using T = typename awaitable_value<typename callable_traits<F>::result>::type;
  if constexpr (std::is_void_v<T>) {
    co_await std::apply(f, std::move(args));
    co_return encode_nil();
  } else {
    auto v = co_await std::apply(f, std::move(args));
    co_return encode_value(v);
  }
}

/// Builds the handler of callable `f`.
template <typename F>
handler make_handler(F f) {
  using traits = callable_traits<F>;
  using args_t = typename traits::args;
  using result_t = typename traits::result;
  constexpr auto seq = std::make_index_sequence<std::tuple_size_v<args_t>>{};
  return [f = std::move(f)](const msgpack::object& o) -> bound_call {
    args_t args = decode_args<args_t>(o, seq);
    bound_call b;
    if constexpr (awaitable_value<result_t>::is_awaitable) {
      b.coro = run_coroutine_function<F, args_t>(f, std::move(args));
    } else {
      b.plain = [f, args = std::move(args)]() mutable -> encoded {
        if constexpr (std::is_void_v<result_t>) {
          std::apply(f, std::move(args));
          return encode_nil();
        } else {
          return encode_value(std::apply(f, std::move(args)));
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
      auto* ctx = corodist::rpc::detail::current_encode();
      if (!ctx)
        throw corodist::usage_error("rpc::attachment can only be packed as part of an RPC call or result");
      const auto idx = static_cast<std::uint32_t>(ctx->segments.size());
      ctx->segments.push_back(corodist::net::segment{a.owner(), asio::const_buffer(a.data(), a.size())});
      char b[4];
      for (int i = 0; i < 4; ++i)
        b[i] = static_cast<char>((idx >> (8 * i)) & 0xff);
      o.pack_ext(4, corodist::rpc::detail::attachment_ext_type);
      o.pack_ext_body(b, 4);
      return o;
    }
  };

  template <>
  struct convert<corodist::rpc::attachment> {
    const msgpack::object& operator()(const msgpack::object& o, corodist::rpc::attachment& v) const {
      if (o.type != msgpack::type::EXT || o.via.ext.type() != corodist::rpc::detail::attachment_ext_type ||
          o.via.ext.size != 4)
        throw msgpack::type_error();
      const auto* ctx = corodist::rpc::detail::current_decode();
      if (!ctx)
        throw msgpack::type_error();
      std::uint32_t idx = 0;
      for (int i = 0; i < 4; ++i)
        idx |= static_cast<std::uint32_t>(static_cast<unsigned char>(o.via.ext.data()[i])) << (8 * i);
      if (idx >= ctx->attachments.size())
        throw msgpack::type_error();
      v = corodist::rpc::attachment(ctx->owner, ctx->attachments[idx]);
      return o;
    }
  };

  } // namespace adaptor
} // MSGPACK_API_VERSION_NAMESPACE
} // namespace msgpack
