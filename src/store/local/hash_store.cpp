#include <corodist/store/hash_store.hpp>

#include "store/local/engine_ops.hpp"

namespace corodist::store {

namespace {

/// The store is its engine: writes go straight to it.
class hash_ops final : public detail::engine_ops {
public:
  explicit hash_ops(asio::any_io_executor ex) : engine_ops(std::move(ex), "hash_store") {}

  asio::awaitable<void> do_set(std::string key, std::string value) override {
    engine_->set(std::move(key), std::move(value));
    co_return;
  }

  // One handle, one owner (the process): an owned key lives as long as the
  // store, as a plain set's does.
  asio::awaitable<void> do_set_owned(std::string key, std::string value) override {
    engine_->set(std::move(key), std::move(value));
    co_return;
  }

  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    co_return engine_->add(key, delta);
  }

  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override {
    co_return engine_->compare_set(key, expected, std::move(desired));
  }

  asio::awaitable<bool> do_delete_key(std::string key) override { co_return engine_->erase(key); }

  asio::awaitable<void> do_append(std::string key, std::string value) override {
    engine_->append(key, value);
    co_return;
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override {
    engine_->multi_set(std::move(keys), std::move(values));
    co_return;
  }
};

} // namespace

hash_store::hash_store(asio::any_io_executor ex) : basic_store(std::make_shared<hash_ops>(std::move(ex))) {}

hash_store::~hash_store() = default;

} // namespace corodist::store
