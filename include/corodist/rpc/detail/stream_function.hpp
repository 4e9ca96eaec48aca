#pragma once
/// \file
/// The templates behind agent::register_stream and agent::open_stream /
/// open_bidi (private to rpc/): a stream function turned into a binder that
/// decodes its arguments and makes its coroutine, and the open frame's body.
///
/// Open body: `[stream id, function name, [args...], timeout_ms, mode,
/// window_items, window_bytes, {metadata}]`.

#include <corodist/core/config.hpp>

#include <corodist/rpc/call_context.hpp>
#include <corodist/rpc/detail/codec.hpp>
#include <corodist/rpc/detail/stream_core.hpp>
#include <corodist/rpc/stream_reader.hpp>
#include <corodist/rpc/stream_writer.hpp>

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace corodist::rpc::detail {

/// Decodes a stream function's arguments (throwing argument_error), installs
/// its reader's inbox, and returns its coroutine.
using stream_binder =
    std::function<asio::awaitable<void>(const msgpack::object& args, call_context ctx, std::shared_ptr<stream_core>)>;

/// A registered stream function.
struct stream_function {
  stream_mode mode = stream_mode::server;
  stream_binder bind;
};

template <typename P>
struct writer_item {
  static constexpr bool is_writer = false;
};
template <typename T>
struct writer_item<stream_writer<T>> {
  static constexpr bool is_writer = true;
  using type = T;
};
template <typename P>
struct reader_item {
  static constexpr bool is_reader = false;
};
template <typename T>
struct reader_item<stream_reader<T>> {
  static constexpr bool is_reader = true;
  using type = T;
};

/// The shape of a stream function's parameters (decayed, call_context removed):
/// `(stream_writer<T>, Args...)` streams from the server;
/// `(stream_reader<In>, stream_writer<Out>, Args...)` is bidirectional.
template <typename Params>
struct stream_shape {
  static constexpr bool valid = false;
};
template <typename W, typename... Args>
  requires writer_item<W>::is_writer
struct stream_shape<std::tuple<W, Args...>> {
  static constexpr bool valid = true;
  static constexpr stream_mode mode = stream_mode::server;
  using out_t = typename writer_item<W>::type;
  using in_t = void;
  using args_t = std::tuple<Args...>;
};
template <typename Rd, typename W, typename... Args>
  requires(reader_item<Rd>::is_reader && writer_item<W>::is_writer)
struct stream_shape<std::tuple<Rd, W, Args...>> {
  static constexpr bool valid = true;
  static constexpr stream_mode mode = stream_mode::bidi;
  using out_t = typename writer_item<W>::type;
  using in_t = typename reader_item<Rd>::type;
  using args_t = std::tuple<Args...>;
};

template <typename F, typename Shape, bool WithContext, typename Args>
asio::awaitable<void> run_stream_function(std::shared_ptr<F> f, std::shared_ptr<stream_core> core, call_context ctx,
                                          Args args) {
  stream_writer<typename Shape::out_t> writer(core);
  if constexpr (Shape::mode == stream_mode::server) {
    co_await std::apply(
        [&](auto&... a) {
          if constexpr (WithContext)
            return (*f)(ctx, writer, std::move(a)...);
          else
            return (*f)(writer, std::move(a)...);
        },
        args);
  } else {
    stream_reader<typename Shape::in_t> reader(core, /*owning=*/false);
    co_await std::apply(
        [&](auto&... a) {
          if constexpr (WithContext)
            return (*f)(ctx, reader, writer, std::move(a)...);
          else
            return (*f)(reader, writer, std::move(a)...);
        },
        args);
  }
}

/// The binder of stream function `f` (shared by every stream it serves).
template <typename F>
stream_function make_stream_function(F f) {
  using traits = callable_traits<F>;
  using params_t = typename traits::params;
  constexpr bool with_context = takes_call_context<params_t>::value;
  using shape = stream_shape<typename wire_params<params_t>::type>;
  static_assert(shape::valid,
                "rpc::register_stream: the function takes ([const call_context&,] stream_writer<T>&, args...) "
                "(server streaming) or ([const call_context&,] stream_reader<In>&, stream_writer<Out>&, args...) "
                "(bidirectional)");
  static_assert(std::is_same_v<typename traits::result, asio::awaitable<void>>,
                "rpc::register_stream: the function is a coroutine returning asio::awaitable<void>");
  using args_t = typename shape::args_t;
  static_assert(!is_non_owning<args_t>::value,
                "rpc::register_stream: a parameter type only views memory (std::string_view, std::span, a "
                "pointer) -- use an owning type (std::string, std::vector<T>, rpc::attachment).");
  auto shared = std::make_shared<F>(std::move(f));
  stream_function sf;
  sf.mode = shape::mode;
  sf.bind = [shared](const msgpack::object& o, call_context ctx,
                     std::shared_ptr<stream_core> core) -> asio::awaitable<void> {
    auto args = decode_args<args_t>(o, std::make_index_sequence<std::tuple_size_v<args_t>>{});
    if constexpr (shape::mode == stream_mode::bidi)
      core->set_inbox(std::make_unique<typed_inbox<typename shape::in_t>>());
    return run_stream_function<F, shape, with_context, args_t>(shared, std::move(core), std::move(ctx),
                                                                std::move(args));
  };
  return sf;
}

/// Encodes an open body with `e`.
template <typename... A>
payload encode_stream_open(encoder& e, std::uint64_t id, std::string_view fn, corodist::deadline by,
                           stream_mode mode, std::size_t window_items, std::size_t window_bytes,
                           const std::vector<std::pair<std::string, std::string>>& metadata, const A&... args) {
  auto& pk = e.packer();
  pk.pack_array(8);
  pk.pack(id);
  pack_value(pk, fn);
  pk.pack_array(static_cast<std::uint32_t>(sizeof...(A)));
  (pack_value(pk, args), ...);
  pk.pack(by.to_wire());
  pk.pack(static_cast<std::uint8_t>(mode));
  pk.pack(static_cast<std::uint64_t>(window_items));
  pk.pack(static_cast<std::uint64_t>(window_bytes));
  pk.pack_map(static_cast<std::uint32_t>(metadata.size()));
  for (auto& [k, v] : metadata) {
    pk.pack(k);
    pk.pack(v);
  }
  return e.finish();
}

} // namespace corodist::rpc::detail
