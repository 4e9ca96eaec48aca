#pragma once
/// \file
/// corodist::rref::rref<T>: a reference to a value that lives on one worker
/// (its owner), usable from any worker -- PyTorch's RRef for C++.

#include <corodist/core/config.hpp>

#include <corodist/core/future.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/decode_result.hpp>
#include <corodist/rref/detail/protocol.hpp>
#include <corodist/rref/rref_id.hpp>

#include <chrono>
#include <memory>
#include <string_view>
#include <utility>

namespace corodist::rref {

/// A remote reference: an OwnerRRef on the owner, a UserRRef anywhere else.
/// Made by `remote()` (a function's result, held by the worker that ran it)
/// or `make_rref()` (a local value). Copying is local (no message); the last
/// copy of a UserRRef going away tells the owner (G1), which deletes its value
/// once no UserRRef and no local reference is left. An rref may be an argument
/// or a result of any RPC (also inside containers and structs): that forks it
/// to the receiver, and the sender keeps its own alive until the owner knows
/// the new one (G2). Thread-safe: copy and use from any thread.
template <typename T>
class rref {
public:
  /// An empty reference (`valid() == false`).
  rref() = default;
  /// Wraps a protocol handle (used by remote(), make_rref() and the codec).
  explicit rref(std::shared_ptr<detail::handle> h) noexcept : h_(std::move(h)) {}

  /// True if it refers to an RRef.
  bool valid() const noexcept { return h_ != nullptr; }
  /// The RRef's id (the same on every worker).
  rref_id id() const { return require().id(); }
  /// The owner's rank.
  int owner() const { return require().owner(); }
  /// True on the owner (this is the OwnerRRef).
  bool is_owner() const { return require().is_owner(); }
  /// True once the owner knows this UserRRef (at once on the owner and for a
  /// reference the owner itself sent); until then the one that sent it keeps
  /// its own alive.
  bool confirmed_by_owner() const { return require().confirmed(); }

  /// Fetches a copy of the value from the owner (or takes it here, on the
  /// owner), waiting for it if the owner's function has not finished yet.
  /// The future (await with `co_await f.async_get()`, or `get()`) holds the
  /// value, or: `remote_error` if the function behind remote() threw (on every
  /// later use too), `timeout_error` past `limit` (`inherit()`: the
  /// context's `timeout`), `connection_error` if the owner is gone. Any
  /// thread. Cancellation: awaiting the future (`co_await f.async_get()`)
  /// supports terminal, partial and total cancellation of that wait
  /// (`operation_aborted`); the fetch itself goes on to its end or deadline
  /// and its result stays in the future (a later `get()` takes it; dropped
  /// with the future); the reference stays usable.
  future<T> to_here(corodist::timeout limit = corodist::timeout::inherit()) const {
    auto p = require().protocol_of("to_here");
    const int owner = h_->owner();
    const auto by = limit.or_else(p->default_timeout()).from();
    // The continuation holds the handle: a reference waiting for its value keeps it alive.
    return p->fetch(h_, by).then([port = &p->port(), owner, keep = h_](net::bytes b) {
      return rpc::decode_result<T>(*port, owner, std::move(b), "to_here of RRef R" + keep->id().str());
    });
  }

  /// The value itself, on the owner: shared with every later reader (methods
  /// change it in place). Waits until remote()'s function has finished (up to
  /// the context's timeout: `timeout_error`); on an event-loop thread it cannot
  /// wait and throws `usage_error` if the value is not there yet. Throws
  /// `usage_error` on a user; `remote_error` if its function threw.
  std::shared_ptr<T> local_value() const {
    auto p = require().protocol_of("local_value");
    return p->local_slot(*h_)->template as<T>(&p->port(), p->self());
  }

  /// Calls `fn` on the owner with the value as its first parameter (a method
  /// registered with `rref::register_method<T>`); returns at once. Any thread.
  template <typename R, typename... A>
  future<R> rpc_async(std::string_view fn, A&&... args) const {
    return agent().template rpc_async<R>(owner(), fn, *this, std::forward<A>(args)...);
  }
  /// As rpc_async, blocking (plain threads only).
  template <typename R, typename... A>
  R rpc_sync(std::string_view fn, A&&... args) const {
    return agent().template rpc_sync<R>(owner(), fn, *this, std::forward<A>(args)...);
  }
  /// As rpc_async, for coroutines. Cancellation: as `rpc::agent::call` (the
  /// cancel reaches the owner, where a method, a plain function, runs to its
  /// end unless it polls `call_context::cancelled()`; the reference stays usable).
  template <typename R, typename... A>
  [[nodiscard]] asio::awaitable<R> call(std::string_view fn, A&&... args) const {
    return agent().template call<R>(owner(), fn, *this, std::forward<A>(args)...);
  }

  /// The protocol handle (the codec's access).
  const std::shared_ptr<detail::handle>& handle() const noexcept { return h_; }

private:
  const detail::handle& require() const {
    if (!h_)
      throw usage_error("rref: an empty reference");
    return *h_;
  }
  rpc::agent& agent() const {
    auto* a = require().protocol_of("a method call")->agent();
    if (!a)
      throw usage_error("rref: no RPC agent behind this reference");
    return *a;
  }

  std::shared_ptr<detail::handle> h_;
};

} // namespace corodist::rref

// ---- msgpack adaptors: an rref inside a message forks itself ----------------

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <typename T>
  struct pack<corodist::rref::rref<T>> {
    template <typename Stream>
    msgpack::packer<Stream>& operator()(msgpack::packer<Stream>& o, const corodist::rref::rref<T>& r) const {
      auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::encode || !ctx->port || ctx->peer < 0)
        throw corodist::usage_error("an rref can only be sent in an RPC message between workers of RRef-enabled "
                                    "agents (rref::enable)");
      if (!r.valid())
        throw corodist::usage_error("an empty rref cannot be sent");
      auto f = corodist::rref::detail::protocol::of(*ctx->port).fork_to(r.handle(), ctx->peer);
      o.pack_array(6);
      o.pack(f.id.worker);
      o.pack(f.id.local);
      o.pack(f.owner);
      o.pack(f.fork.worker);
      o.pack(f.fork.local);
      o.pack(f.parent);
      return o;
    }
  };

  template <typename T>
  struct convert<corodist::rref::rref<T>> {
    const msgpack::object& operator()(const msgpack::object& o, corodist::rref::rref<T>& r) const {
      if (o.type != msgpack::type::ARRAY || o.via.array.size != 6)
        throw msgpack::type_error();
      auto* ctx = corodist::rpc::codec_context::current();
      if (!ctx || ctx->direction != corodist::rpc::codec_context::mode::decode || !ctx->port)
        throw msgpack::type_error();
      const auto* a = o.via.array.ptr;
      corodist::rref::detail::fork_info f;
      f.id = {a[0].as<std::int32_t>(), a[1].as<std::uint64_t>()};
      f.owner = a[2].as<std::int32_t>();
      f.fork = {a[3].as<std::int32_t>(), a[4].as<std::uint64_t>()};
      f.parent = a[5].as<std::int32_t>();
      r = corodist::rref::rref<T>(corodist::rref::detail::protocol::of(*ctx->port).adopt(f, ctx->peer));
      return o;
    }
  };

  } // namespace adaptor
} // MSGPACK_API_VERSION_NAMESPACE
} // namespace msgpack
