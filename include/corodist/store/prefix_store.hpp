#pragma once
/// \file
/// corodist::store::prefix_store: a key-prefix decorator (c10d's PrefixStore).

#include <corodist/core/config.hpp>

#include <corodist/store/store.hpp>

namespace corodist::store {

/// Forwards every operation to `underlying` with keys rewritten to
/// `prefix + "/" + key`, so that several groups can share one store.
/// `num_keys()` counts the underlying store's keys (as c10d does);
/// `list_keys` and watch events report keys without the prefix.
class prefix_store : public store {
public:
  /// Wraps `underlying` (which must not be null).
  prefix_store(std::string prefix, std::shared_ptr<store> underlying);

  asio::any_io_executor get_executor() override { return inner_->get_executor(); }

  /// The prefix (without the trailing "/").
  const std::string& prefix() const noexcept { return prefix_; }
  /// The wrapped store.
  const std::shared_ptr<store>& underlying() const noexcept { return inner_; }

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
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys(std::vector<std::string> ks) const;

  std::string prefix_;
  std::shared_ptr<store> inner_;
};

} // namespace corodist::store
