#include <corodist/core/error.hpp>
#include <corodist/store/basic_store.hpp>

#include "store/store_ops.hpp"

namespace corodist::store {

// Each forwarder returns the implementation's awaitable as it is: no
// coroutine frame of its own.

basic_store::basic_store(std::shared_ptr<detail::store_ops> ops) : ops_(std::move(ops)) {
  if (!ops_)
    throw usage_error("basic_store: no implementation");
  ex_ = ops_->executor();
}

basic_store::~basic_store() = default;

asio::awaitable<void> basic_store::do_set(std::string key, std::string value) {
  return ops_->set(std::move(key), std::move(value));
}

asio::awaitable<std::string> basic_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  return ops_->get(std::move(key), timeout);
}

asio::awaitable<std::int64_t> basic_store::do_add(std::string key, std::int64_t delta) {
  return ops_->add(std::move(key), delta);
}

asio::awaitable<std::string> basic_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  return ops_->compare_set(std::move(key), std::move(expected), std::move(desired));
}

asio::awaitable<bool> basic_store::do_delete_key(std::string key) { return ops_->delete_key(std::move(key)); }

asio::awaitable<bool> basic_store::do_check(std::vector<std::string> keys) { return ops_->check(std::move(keys)); }

asio::awaitable<void> basic_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  return ops_->wait(std::move(keys), timeout);
}

asio::awaitable<std::int64_t> basic_store::do_num_keys() { return ops_->num_keys(); }

asio::awaitable<void> basic_store::do_append(std::string key, std::string value) {
  return ops_->append(std::move(key), std::move(value));
}

asio::awaitable<std::vector<std::string>> basic_store::do_multi_get(std::vector<std::string> keys,
                                                                    std::chrono::milliseconds timeout) {
  return ops_->multi_get(std::move(keys), timeout);
}

asio::awaitable<void> basic_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  return ops_->multi_set(std::move(keys), std::move(values));
}

asio::awaitable<std::vector<std::string>> basic_store::do_list_keys(std::string prefix) {
  return ops_->list_keys(std::move(prefix));
}

asio::awaitable<watch_stream> basic_store::do_watch_key(std::string key) { return ops_->watch_key(std::move(key)); }

} // namespace corodist::store
