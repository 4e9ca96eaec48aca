#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/store/hash_store.hpp>

#include "store/kv_state.hpp"

namespace corodist::store {

hash_store::hash_store(asio::any_io_executor ex)
    : ex_(std::move(ex)), state_(std::make_shared<detail::kv_state>(ex_)) {}

hash_store::~hash_store() = default;

asio::awaitable<void> hash_store::do_set(std::string key, std::string value) {
  state_->set(key, std::move(value));
  co_return;
}

asio::awaitable<std::string> hash_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  for (;;) {
    if (auto* v = state_->find(key))
      co_return *v;
    std::vector<std::string> keys{key};
    co_await do_wait(std::move(keys), timeout);
  }
}

asio::awaitable<std::int64_t> hash_store::do_add(std::string key, std::int64_t delta) {
  co_return state_->add(key, delta);
}

asio::awaitable<std::string> hash_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  co_return state_->compare_set(key, expected, std::move(desired));
}

asio::awaitable<bool> hash_store::do_delete_key(std::string key) { co_return state_->erase(key); }

asio::awaitable<bool> hash_store::do_check(std::vector<std::string> keys) { co_return state_->contains_all(keys); }

asio::awaitable<void> hash_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  promise<std::vector<std::string>> p;
  auto f = p.get_future();
  state_->wait(std::move(keys), timeout, 0, [p = std::move(p)](std::vector<std::string>&&, std::vector<std::string>&& missing) mutable {
    p.set_value(std::move(missing));
  });
  auto missing = co_await f.async_get();
  if (!missing.empty())
    throw timeout_error(detail::timeout_message(missing, timeout));
}

asio::awaitable<std::int64_t> hash_store::do_num_keys() { co_return static_cast<std::int64_t>(state_->size()); }

asio::awaitable<void> hash_store::do_append(std::string key, std::string value) {
  state_->append(key, value);
  co_return;
}

asio::awaitable<std::vector<std::string>> hash_store::do_multi_get(std::vector<std::string> keys,
                                                                   std::chrono::milliseconds timeout) {
  for (;;) {
    if (state_->contains_all(keys)) {
      std::vector<std::string> out;
      out.reserve(keys.size());
      for (auto& k : keys)
        out.push_back(*state_->find(k));
      co_return out;
    }
    co_await do_wait(keys, timeout);
  }
}

asio::awaitable<void> hash_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  detail::check_multi_set(keys, values);
  for (std::size_t i = 0; i < keys.size(); ++i)
    state_->set(keys[i], std::move(values[i]));
  co_return;
}

asio::awaitable<std::vector<std::string>> hash_store::do_list_keys(std::string prefix) {
  co_return state_->list(prefix);
}

asio::awaitable<watch_stream> hash_store::do_watch_key(std::string key) {
  auto q = std::make_shared<detail::watch_queue>(ex_);
  auto id = state_->watch(key, 0, [w = std::weak_ptr<detail::watch_queue>(q)](const watch_event& e) {
    if (auto q = w.lock())
      q->push(e);
  });
  q->on_close = [s = std::weak_ptr<detail::kv_state>(state_), id] {
    if (auto st = s.lock())
      st->unwatch(id);
  };
  co_return watch_stream(q);
}

} // namespace corodist::store
