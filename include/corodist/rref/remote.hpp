#pragma once
/// \file
/// corodist::rref::remote and make_rref: where RRefs come from.

#include <corodist/core/config.hpp>

#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/rref.hpp>

#include <optional>
#include <string_view>
#include <utility>

namespace corodist::rref {

namespace detail {
/// remote() on a message port (the agent's, or a simulated one).
template <typename R, typename... A>
rref<R> remote_on(rpc::message_port& port, corodist::timeout limit, rpc::worker_ref to, std::string_view fn,
                  const A&... args) {
  auto& p = protocol::of(port);
  const int owner = port.worker(to).rank;
  const auto by = limit.or_else(p.default_timeout()).from();
  auto h = p.new_remote(owner);
  // [R, F, fn, [args...], timeout_ms]: the RRef and its creator's fork, then the call.
  rpc::encoder e(&port, p.self(), owner);
  auto& pk = e.packer();
  pk.pack_array(7);
  pk.pack(h->id().worker);
  pk.pack(h->id().local);
  pk.pack(h->fork().worker);
  pk.pack(h->fork().local);
  rpc::pack_value(pk, fn);
  pk.pack_array(static_cast<std::uint32_t>(sizeof...(A)));
  (rpc::pack_value(pk, args), ...);
  pk.pack(by.to_wire());
  p.send_remote(h, fn, e.finish(), by);
  return rref<R>(std::move(h));
}

/// make_rref() on a message port.
template <typename T>
rref<std::decay_t<T>> make_rref_on(rpc::message_port& port, T&& value) {
  return rref<std::decay_t<T>>(
      protocol::of(port).new_owned(value_slot::of(std::decay_t<T>(std::forward<T>(value)))));
}
} // namespace detail

/// Runs `fn(args...)` on worker `to` and returns at once a reference to its
/// result, which `to` holds (the owner). `to_here()` fetches it; if `fn`
/// throws, every use rethrows it as remote_error. The call runs once (never
/// retried); its deadline is the context's timeout. Throws usage_error at once
/// for an unknown worker or an agent without RRefs (rref::enable). Any thread.
template <typename R, typename... A>
rref<R> remote(rpc::agent& a, rpc::worker_ref to, std::string_view fn, A&&... args) {
  return detail::remote_on<R>(a.port(), corodist::timeout::inherit(), to, fn, args...);
}

/// As above within `limit` for the call (`inherit()`: the context's
/// `timeout`; `never()`: none): `rref::remote<int>(agent, 5s, "w1", "f")`.
template <typename R, typename... A>
rref<R> remote(rpc::agent& a, corodist::timeout limit, rpc::worker_ref to, std::string_view fn, A&&... args) {
  return detail::remote_on<R>(a.port(), limit, to, fn, args...);
}

/// An OwnerRRef here, holding `value` (PyTorch's RRef(value)): send it to
/// other workers to share the value. Any thread.
template <typename T>
rref<std::decay_t<T>> make_rref(rpc::agent& a, T&& value) {
  return detail::make_rref_on(a.port(), std::forward<T>(value));
}

} // namespace corodist::rref
