#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/sync_store.hpp>

#include <corodist/core/run_blocking.hpp>

namespace corodist::store {

sync_store::sync_store(std::shared_ptr<store> s) : store_(std::move(s)) {
  if (!store_)
    throw usage_error("sync_store: the store is null");
}

template <typename T>
T sync_store::run(asio::awaitable<T> op) {
  return run_blocking(store_->get_executor(), std::move(op), "sync_store (a blocking store call)");
}

void sync_store::set(std::string key, std::string value) { run(store_->set(std::move(key), std::move(value))); }
std::string sync_store::get(std::string key, corodist::timeout limit) {
  return run(store_->get(std::move(key), limit));
}
std::int64_t sync_store::add(std::string key, std::int64_t delta) { return run(store_->add(std::move(key), delta)); }
std::string sync_store::compare_set(std::string key, std::string expected, std::string desired) {
  return run(store_->compare_set(std::move(key), std::move(expected), std::move(desired)));
}
bool sync_store::delete_key(std::string key) { return run(store_->delete_key(std::move(key))); }
bool sync_store::check(std::vector<std::string> keys) { return run(store_->check(std::move(keys))); }
void sync_store::wait(std::vector<std::string> keys, corodist::timeout limit) {
  run(store_->wait(std::move(keys), limit));
}
std::int64_t sync_store::num_keys() { return run(store_->num_keys()); }
void sync_store::append(std::string key, std::string value) { run(store_->append(std::move(key), std::move(value))); }
std::vector<std::string> sync_store::multi_get(std::vector<std::string> keys, corodist::timeout limit) {
  return run(store_->multi_get(std::move(keys), limit));
}
void sync_store::multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  run(store_->multi_set(std::move(keys), std::move(values)));
}
std::vector<std::string> sync_store::list_keys(std::string prefix) { return run(store_->list_keys(std::move(prefix))); }
watch_stream sync_store::watch_key(std::string key) { return run(store_->watch_key(std::move(key))); }
watch_event sync_store::next(watch_stream& stream, corodist::timeout limit) {
  return run(stream.next(limit));
}
void sync_store::barrier(std::string name, std::int64_t world_size, corodist::timeout limit) {
  run(store_->barrier(std::move(name), world_size, limit));
}

} // namespace corodist::store
