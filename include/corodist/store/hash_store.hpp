#pragma once
/// \file
/// corodist::store::hash_store: an in-process store (c10d's HashStore).

#include <corodist/core/config.hpp>

#include <corodist/store/store.hpp>

namespace corodist::store {

namespace detail {
class engine;
class wait_log;
} // namespace detail

/// A store held in memory by this process; ranks that are threads of one
/// process share it. State lives on `ex`; any thread may await its operations.
/// It has the store server's semantics (the same engine) without its limits.
class hash_store : public store {
public:
  /// Creates an empty store whose state lives on `ex`.
  explicit hash_store(asio::any_io_executor ex);
  ~hash_store() override;

  asio::any_io_executor get_executor() override { return ex_; }

protected:
  asio::awaitable<void> do_set(std::string key, std::string value) override;
  asio::awaitable<std::string> do_get(std::string key, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override;
  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override;
  asio::awaitable<bool> do_delete_key(std::string key) override;
  asio::awaitable<bool> do_check(std::vector<std::string> keys) override;
  asio::awaitable<void> do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_num_keys() override;
  asio::awaitable<void> do_append(std::string key, std::string value) override;
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                         std::chrono::milliseconds timeout) override;
  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override;
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) override;
  asio::awaitable<watch_stream> do_watch_key(std::string key) override;

private:
  asio::any_io_executor ex_;
  std::shared_ptr<detail::engine> engine_;
  std::unique_ptr<detail::wait_log> waits_;
};

} // namespace corodist::store
