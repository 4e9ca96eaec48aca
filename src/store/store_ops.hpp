#pragma once
// The operations of one of corodist's stores (private): what each store
// implements, and basic_store forwards every `store` operation to. The
// semantics are `store`'s (corodist/store/store.hpp); each call runs on the
// store's executor.

#include <corodist/store/watch_stream.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace corodist::store::detail {

class store_ops {
public:
  virtual ~store_ops() = default;

  /// The executor the store's state lives on (never changes).
  virtual asio::any_io_executor executor() = 0;

  virtual asio::awaitable<void> set(std::string key, std::string value) = 0;
  virtual asio::awaitable<std::string> get(std::string key, std::chrono::milliseconds timeout) = 0;
  virtual asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) = 0;
  virtual asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) = 0;
  virtual asio::awaitable<bool> delete_key(std::string key) = 0;
  virtual asio::awaitable<bool> check(std::vector<std::string> keys) = 0;
  virtual asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) = 0;
  virtual asio::awaitable<std::int64_t> num_keys() = 0;
  virtual asio::awaitable<void> append(std::string key, std::string value) = 0;
  virtual asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys,
                                                              std::chrono::milliseconds timeout) = 0;
  virtual asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) = 0;
  virtual asio::awaitable<std::vector<std::string>> list_keys(std::string prefix) = 0;
  virtual asio::awaitable<watch_stream> watch_key(std::string key) = 0;
};

} // namespace corodist::store::detail
