#include <corodist/core/error.hpp>
#include <corodist/store/prefix_store.hpp>

namespace corodist::store {

prefix_store::prefix_store(std::string prefix, std::shared_ptr<store> underlying)
    : prefix_(std::move(prefix)), inner_(std::move(underlying)) {
  if (!inner_)
    throw usage_error("prefix_store: the underlying store is null");
  set_timeout(inner_->timeout());
}

std::vector<std::string> prefix_store::keys(std::vector<std::string> ks) const {
  for (auto& k : ks)
    k = key(k);
  return ks;
}

asio::awaitable<void> prefix_store::do_set(std::string k, std::string value) {
  co_await inner_->set(key(k), std::move(value));
}

asio::awaitable<std::string> prefix_store::do_get(std::string k, std::chrono::milliseconds timeout) {
  co_return co_await inner_->get(key(k), timeout);
}

asio::awaitable<std::int64_t> prefix_store::do_add(std::string k, std::int64_t delta) {
  co_return co_await inner_->add(key(k), delta);
}

asio::awaitable<std::string> prefix_store::do_compare_set(std::string k, std::string expected, std::string desired) {
  co_return co_await inner_->compare_set(key(k), std::move(expected), std::move(desired));
}

asio::awaitable<bool> prefix_store::do_delete_key(std::string k) { co_return co_await inner_->delete_key(key(k)); }

asio::awaitable<bool> prefix_store::do_check(std::vector<std::string> ks) {
  co_return co_await inner_->check(keys(std::move(ks)));
}

asio::awaitable<void> prefix_store::do_wait(std::vector<std::string> ks, std::chrono::milliseconds timeout) {
  co_await inner_->wait(keys(std::move(ks)), timeout);
}

asio::awaitable<std::int64_t> prefix_store::do_num_keys() { co_return co_await inner_->num_keys(); }

asio::awaitable<void> prefix_store::do_append(std::string k, std::string value) {
  co_await inner_->append(key(k), std::move(value));
}

asio::awaitable<std::vector<std::string>> prefix_store::do_multi_get(std::vector<std::string> ks,
                                                                     std::chrono::milliseconds timeout) {
  co_return co_await inner_->multi_get(keys(std::move(ks)), timeout);
}

asio::awaitable<void> prefix_store::do_multi_set(std::vector<std::string> ks, std::vector<std::string> values) {
  co_await inner_->multi_set(keys(std::move(ks)), std::move(values));
}

asio::awaitable<std::vector<std::string>> prefix_store::do_list_keys(std::string p) {
  auto found = co_await inner_->list_keys(key(p));
  for (auto& k : found)
    k.erase(0, prefix_.size() + 1);
  co_return found;
}

asio::awaitable<watch_stream> prefix_store::do_watch_key(std::string k) {
  auto s = co_await inner_->watch_key(key(k));
  s.q_->key_strip += prefix_.size() + 1;
  co_return s;
}

} // namespace corodist::store
