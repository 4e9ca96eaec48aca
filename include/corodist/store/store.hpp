#pragma once
/// \file
/// corodist::store::store: the key-value store interface (c10d's Store),
/// coroutine-first. Implementations: tcp_store (client of store_server),
/// torch_store (client of a PyTorch TCPStore master), hash_store
/// (in-process), file_store (shared file), prefix_store.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/store/default_timeout.hpp>
#include <corodist/store/errors.hpp>
#include <corodist/store/watch_stream.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace corodist::store {

class basic_store;

/// A key-value store shared by the ranks of a job.
///
/// Keys and values are byte strings (`std::string`, binary-safe). Every
/// operation is a coroutine that may be awaited from any executor: it runs on
/// the store's own executor (`get_executor()`) and resumes the caller on its.
/// Operations that wait (`get`, `wait`, `multi_get`, `barrier`) take a
/// `corodist::timeout` (default `inherit()`: the store's `timeout()`, 300 s
/// as c10d's), made into a deadline when the call starts; past it they throw
/// `timeout_error` (a deadline already passed when the call starts: at once,
/// nothing sent). Operations that do not wait are bounded by `timeout()`.
/// Network failures throw `connection_error`; limits and bad requests
/// `store_error`. For plain threads use `sync_store`.
///
/// Cancellation (every operation): through the awaiting coroutine's
/// cancellation slot. Terminal cancellation always reaches the operation;
/// partial and total only when the caller's coroutine lets them through
/// (`asio::this_coro::reset_cancellation_state`; Asio's coroutines pass
/// terminal only by default) and awaits on the store's executor (awaited from
/// another executor, the operation runs in a coroutine of its own there,
/// which passes terminal only). The operation then ends with
/// `asio::error::operation_aborted` (a `std::system_error`) and the store
/// and its connection stay usable. A cancelled waiting operation (`get`,
/// `wait`, `multi_get`, `barrier`'s wait) changes no key, but the wait it
/// registered where the keys live (tcp_store: at the store_server, counted
/// in `pending_waits()` and its limits; hash_store: in its own engine) stays
/// there until its keys appear, its deadline passes or the connection
/// closes, and its answer is then dropped: a cancelled wait without a time
/// limit holds its place until then. torch_store instead drops its socket
/// (the master forgets the query; the next operation reconnects). A
/// cancelled write (`set`, `set_owned`, `add`, `compare_set`, `delete_key`,
/// `append`, `multi_set`, `barrier`'s arrival) may or may not have been
/// applied: it was sent before the cancellation took effect, or not; read
/// the key to know. A cancelled `watch_key` may leave its subscription at
/// the server (its events are ignored) until the connection closes.
class store : public std::enable_shared_from_this<store> {
public:
  virtual ~store() = default;

  /// The executor the store's state lives on.
  virtual asio::any_io_executor get_executor() = 0;

  /// The time limit of waiting operations called without one, and of every
  /// request that does not wait.
  corodist::timeout timeout() const noexcept { return timeout_; }
  /// Sets `timeout()` (`inherit()`: back to `default_timeout`). Not
  /// thread-safe against running operations.
  void set_timeout(corodist::timeout t) noexcept { timeout_ = t.or_else(default_timeout); }

  /// Stores `value` under `key`, waking waiters and watchers.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<void> set(std::string key, std::string value) {
    return on_executor(do_set(std::move(key), std::move(value)));
  }

  /// Stores `value` under `key` as `set` does, owned by this client: the key
  /// lives only as long as this client's connection to the store. When the
  /// connection closes for any reason (the client is closed or destroyed, its
  /// process dies, the connection is reset, or the server's heartbeat
  /// deadline passes), the server deletes the key if this client still owns
  /// it: watchers see `deleted`, waiters go on waiting. A later write of the
  /// key by anyone (set, set_owned, add, append, compare_set that stores,
  /// delete_key) takes the ownership away. Supported by tcp_store and
  /// prefix_store over one; hash_store (one handle, in-process) keeps the key
  /// for the store's life, as `set`; file_store and torch_store throw
  /// `usage_error`.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<void> set_owned(std::string key, std::string value) {
    return on_executor(do_set_owned(std::move(key), std::move(value)));
  }

  /// Returns the value of `key`, waiting for it to be set within `limit`
  /// (default: `timeout()`). Throws `timeout_error` naming the key.
  /// Cancellation: see the class comment; no key changes, the wait stays
  /// registered until its keys, its deadline or the connection's end.
  [[nodiscard]] asio::awaitable<std::string> get(std::string key,
                                                 corodist::timeout limit = corodist::timeout::inherit()) {
    const auto by = deadline_of(limit);
    return on_executor(do_get(std::move(key), by), by);
  }

  /// Atomically adds `delta` to the integer (decimal text) at `key`, creating
  /// it as 0 first; returns the new value. Throws `store_error` if the value is
  /// not an integer.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) {
    return on_executor(do_add(std::move(key), delta));
  }

  /// c10d's compareSet: if `key` holds `expected`, stores `desired` and
  /// returns it; if `key` is missing and `expected` is empty, stores `desired`
  /// and returns it; otherwise returns the current value (or `expected` when
  /// the key is missing) unchanged.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
    return on_executor(do_compare_set(std::move(key), std::move(expected), std::move(desired)));
  }

  /// Deletes `key`; returns whether it existed.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<bool> delete_key(std::string key) { return on_executor(do_delete_key(std::move(key))); }

  /// Returns whether every key exists (no waiting).
  /// Cancellation: see the class comment; nothing changes.
  [[nodiscard]] asio::awaitable<bool> check(std::vector<std::string> keys) {
    return on_executor(do_check(std::move(keys)));
  }

  /// Waits until every key exists, within `limit` (default: `timeout()`);
  /// throws `timeout_error` naming the keys.
  /// Cancellation: see the class comment; no key changes, the wait stays
  /// registered until its keys, its deadline or the connection's end.
  [[nodiscard]] asio::awaitable<void> wait(std::vector<std::string> keys,
                                           corodist::timeout limit = corodist::timeout::inherit()) {
    const auto by = deadline_of(limit);
    return on_executor(do_wait(std::move(keys), by), by);
  }

  /// Returns the number of keys in the store.
  /// Cancellation: see the class comment; nothing changes.
  [[nodiscard]] asio::awaitable<std::int64_t> num_keys() { return on_executor(do_num_keys()); }

  /// Appends `value` to the value at `key` (creating it).
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<void> append(std::string key, std::string value) {
    return on_executor(do_append(std::move(key), std::move(value)));
  }

  /// Returns the values of `keys`, waiting for all of them within `limit`
  /// (default: `timeout()`).
  /// Cancellation: see the class comment; no key changes, the wait stays
  /// registered until its keys, its deadline or the connection's end.
  [[nodiscard]] asio::awaitable<std::vector<std::string>>
  multi_get(std::vector<std::string> keys, corodist::timeout limit = corodist::timeout::inherit()) {
    const auto by = deadline_of(limit);
    return on_executor(do_multi_get(std::move(keys), by), by);
  }

  /// Sets every `keys[i]` to `values[i]` as one operation. Throws
  /// `store_error` if the sizes differ.
  /// Cancellation: see the class comment; a cancelled write may have been applied.
  [[nodiscard]] asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
    return on_executor(do_multi_set(std::move(keys), std::move(values)));
  }

  /// Returns the keys that start with `prefix`, sorted (a debugging aid).
  /// Cancellation: see the class comment; nothing changes.
  [[nodiscard]] asio::awaitable<std::vector<std::string>> list_keys(std::string prefix = {}) {
    return on_executor(do_list_keys(std::move(prefix)));
  }

  /// Subscribes to changes of `key`: the stream yields created / updated /
  /// deleted events in the order the store applied them, from now on.
  /// Cancellation: see the class comment; the subscription may stay at the
  /// server, its events ignored, until the connection closes.
  [[nodiscard]] asio::awaitable<watch_stream> watch_key(std::string key) {
    return on_executor(do_watch_key(std::move(key)));
  }

  /// A one-shot barrier of `world_size` participants named `name`, built on
  /// `add` + `wait`: returns once all have arrived within `limit` (default:
  /// `timeout()`), or throws `timeout_error`.
  /// Cancellation: see the class comment; a cancelled barrier may have
  /// counted its arrival (the barrier name is then used up for this rank).
  [[nodiscard]] asio::awaitable<void> barrier(std::string name, std::int64_t world_size,
                                              corodist::timeout limit = corodist::timeout::inherit()) {
    const auto by = deadline_of(limit);
    return on_executor(do_barrier(std::move(name), world_size, by), by);
  }

protected:
  // The operations of an implementation. Waiting ones get the deadline the
  // public call made of its timeout (never expired when they start); a
  // client sends the server the time remaining.
  virtual asio::awaitable<void> do_set(std::string key, std::string value) = 0;
  /// Owned keys; the default throws `usage_error` naming the store's type (a
  /// store without connections of its own cannot tie a key to one).
  virtual asio::awaitable<void> do_set_owned(std::string key, std::string value);
  virtual asio::awaitable<std::string> do_get(std::string key, corodist::deadline by) = 0;
  virtual asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) = 0;
  virtual asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) = 0;
  virtual asio::awaitable<bool> do_delete_key(std::string key) = 0;
  virtual asio::awaitable<bool> do_check(std::vector<std::string> keys) = 0;
  virtual asio::awaitable<void> do_wait(std::vector<std::string> keys, corodist::deadline by) = 0;
  virtual asio::awaitable<std::int64_t> do_num_keys() = 0;
  virtual asio::awaitable<void> do_append(std::string key, std::string value) = 0;
  virtual asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                                 corodist::deadline by) = 0;
  virtual asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) = 0;
  virtual asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) = 0;
  virtual asio::awaitable<watch_stream> do_watch_key(std::string key) = 0;
  /// Default barrier: add(name/count) then wait(name/done); the last arrival sets done.
  virtual asio::awaitable<void> do_barrier(std::string name, std::int64_t world_size, corodist::deadline by);

  /// The deadline a call with `limit` (`inherit()`: `timeout()`) has from now.
  corodist::deadline deadline_of(corodist::timeout limit) const noexcept { return limit.or_else(timeout_).from(); }

  /// Runs `op` on `get_executor()`, resuming the caller on its own executor.
  /// The store stays alive until `op` ends, even if the caller drops its last
  /// reference meanwhile (when it is owned by a shared_ptr).
  template <typename T>
  asio::awaitable<T> on_executor(asio::awaitable<T> op) {
    const auto keep_alive = weak_from_this().lock();
    auto mine = get_executor();
    if ((co_await asio::this_coro::executor) == mine)
      co_return co_await std::move(op);
    co_return co_await asio::co_spawn(mine, std::move(op), asio::use_awaitable);
  }

  /// As above for an operation bounded by `by`: throws `timeout_error` at
  /// once, without starting `op`, when `by` has already passed.
  template <typename T>
  asio::awaitable<T> on_executor(asio::awaitable<T> op, corodist::deadline by) {
    if (by.expired())
      throw_expired();
    co_return co_await on_executor(std::move(op));
  }

  [[noreturn]] static void throw_expired();

private:
  friend class basic_store; // forwards its operations to another store's do_ functions

  corodist::timeout timeout_ = default_timeout;
};

} // namespace corodist::store
