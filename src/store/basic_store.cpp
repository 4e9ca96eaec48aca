#include <corodist/core/error.hpp>
#include <corodist/store/basic_store.hpp>

namespace corodist::store {

// Each forwarder returns the implementation's awaitable as it is: no
// coroutine frame of its own.

basic_store::basic_store(std::shared_ptr<store> impl) : impl_(std::move(impl)) {
  if (!impl_)
    throw usage_error("basic_store: no implementation");
  ex_ = impl_->get_executor();
}

basic_store::~basic_store() = default;

asio::awaitable<void> basic_store::do_set(std::string key, std::string value) {
  return impl_->do_set(std::move(key), std::move(value));
}

asio::awaitable<void> basic_store::do_set_owned(std::string key, std::string value) {
  return impl_->do_set_owned(std::move(key), std::move(value));
}

asio::awaitable<std::string> basic_store::do_get(std::string key, corodist::deadline by) {
  return impl_->do_get(std::move(key), by);
}

asio::awaitable<std::int64_t> basic_store::do_add(std::string key, std::int64_t delta) {
  return impl_->do_add(std::move(key), delta);
}

asio::awaitable<std::string> basic_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  return impl_->do_compare_set(std::move(key), std::move(expected), std::move(desired));
}

asio::awaitable<bool> basic_store::do_delete_key(std::string key) { return impl_->do_delete_key(std::move(key)); }

asio::awaitable<bool> basic_store::do_check(std::vector<std::string> keys) { return impl_->do_check(std::move(keys)); }

asio::awaitable<void> basic_store::do_wait(std::vector<std::string> keys, corodist::deadline by) {
  return impl_->do_wait(std::move(keys), by);
}

asio::awaitable<std::int64_t> basic_store::do_num_keys() { return impl_->do_num_keys(); }

asio::awaitable<void> basic_store::do_append(std::string key, std::string value) {
  return impl_->do_append(std::move(key), std::move(value));
}

asio::awaitable<std::vector<std::string>> basic_store::do_multi_get(std::vector<std::string> keys,
                                                                    corodist::deadline by) {
  return impl_->do_multi_get(std::move(keys), by);
}

asio::awaitable<void> basic_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  return impl_->do_multi_set(std::move(keys), std::move(values));
}

asio::awaitable<std::vector<std::string>> basic_store::do_list_keys(std::string prefix) {
  return impl_->do_list_keys(std::move(prefix));
}

asio::awaitable<watch_stream> basic_store::do_watch_key(std::string key) { return impl_->do_watch_key(std::move(key)); }

} // namespace corodist::store
