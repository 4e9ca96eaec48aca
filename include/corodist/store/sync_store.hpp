#pragma once
/// \file
/// corodist::store::sync_store: the blocking facade of a store, for plain threads.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/store/store.hpp>

namespace corodist::store {

/// Blocking versions of every `store` operation. Each call runs the
/// coroutine on the store's executor and blocks the calling thread until it
/// finishes; waits are bounded by the store's timeouts. Calling from an
/// event-loop thread throws `usage_error` (it would deadlock the loop).
/// Cancellation: none; a blocking call runs to its end or its time limit
/// (use the coroutine API, `async()`, to cancel).
/// Thread-safe: many threads may share one sync_store.
class sync_store {
public:
  /// Wraps `s` (must not be null).
  explicit sync_store(std::shared_ptr<store> s);

  /// The wrapped store (for its coroutine API).
  const std::shared_ptr<store>& async() const noexcept { return store_; }

  void set(std::string key, std::string value);
  std::string get(std::string key, corodist::timeout limit = corodist::timeout::inherit());
  std::int64_t add(std::string key, std::int64_t delta);
  std::string compare_set(std::string key, std::string expected, std::string desired);
  bool delete_key(std::string key);
  bool check(std::vector<std::string> keys);
  void wait(std::vector<std::string> keys, corodist::timeout limit = corodist::timeout::inherit());
  std::int64_t num_keys();
  void append(std::string key, std::string value);
  std::vector<std::string> multi_get(std::vector<std::string> keys,
                                     corodist::timeout limit = corodist::timeout::inherit());
  void multi_set(std::vector<std::string> keys, std::vector<std::string> values);
  std::vector<std::string> list_keys(std::string prefix = {});
  watch_stream watch_key(std::string key);
  /// Blocks for the next event of `stream` (see watch_stream::next).
  watch_event next(watch_stream& stream, corodist::timeout limit = corodist::timeout::inherit());
  void barrier(std::string name, std::int64_t world_size, corodist::timeout limit = corodist::timeout::inherit());

private:
  template <typename T>
  T run(asio::awaitable<T> op);

  std::shared_ptr<store> store_;
};

} // namespace corodist::store
