#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/store/hash_store.hpp>

#include "store/engine.hpp"
#include "store/wait_log.hpp"

namespace corodist::store {

hash_store::hash_store(asio::any_io_executor ex)
    : ex_(std::move(ex)), engine_(std::make_shared<detail::engine>(ex_)),
      waits_(std::make_unique<detail::wait_log>(ex_, "hash_store")) {}

hash_store::~hash_store() = default;

asio::awaitable<void> hash_store::do_set(std::string key, std::string value) {
  engine_->set(std::move(key), std::move(value));
  co_return;
}

asio::awaitable<std::string> hash_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  for (;;) {
    if (auto* v = engine_->get(key))
      co_return *v;
    std::vector<std::string> keys{key};
    co_await do_wait(std::move(keys), timeout);
  }
}

asio::awaitable<std::int64_t> hash_store::do_add(std::string key, std::int64_t delta) {
  co_return engine_->add(key, delta);
}

asio::awaitable<std::string> hash_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  co_return engine_->compare_set(key, expected, std::move(desired));
}

asio::awaitable<bool> hash_store::do_delete_key(std::string key) { co_return engine_->erase(key); }

asio::awaitable<bool> hash_store::do_check(std::vector<std::string> keys) { co_return engine_->check(keys); }

asio::awaitable<void> hash_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  detail::wait_log::entry logged(*waits_, keys, timeout);
  promise<std::vector<std::string>> p;
  auto f = p.get_future();
  engine_->wait(keys, timeout, 0,
                [p = std::move(p)](std::vector<std::string>&&, std::vector<std::string>&& missing) mutable {
                  p.set_value(std::move(missing));
                });
  auto missing = co_await f.async_get();
  if (!missing.empty())
    throw timeout_error(detail::rules::timeout_message(missing, timeout));
}

asio::awaitable<std::int64_t> hash_store::do_num_keys() { co_return static_cast<std::int64_t>(engine_->size()); }

asio::awaitable<void> hash_store::do_append(std::string key, std::string value) {
  engine_->append(key, value);
  co_return;
}

asio::awaitable<std::vector<std::string>> hash_store::do_multi_get(std::vector<std::string> keys,
                                                                   std::chrono::milliseconds timeout) {
  while (!engine_->check(keys))
    co_await do_wait(keys, timeout);
  co_return engine_->values(keys);
}

asio::awaitable<void> hash_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  engine_->multi_set(std::move(keys), std::move(values));
  co_return;
}

asio::awaitable<std::vector<std::string>> hash_store::do_list_keys(std::string prefix) {
  co_return engine_->list(prefix);
}

asio::awaitable<watch_stream> hash_store::do_watch_key(std::string key) {
  auto q = std::make_shared<detail::watch_queue>(ex_);
  auto id = engine_->watch(key, 0, [w = std::weak_ptr<detail::watch_queue>(q)](const watch_event& e) {
    if (auto q = w.lock())
      q->push(e);
  });
  q->on_close = [s = std::weak_ptr<detail::engine>(engine_), id] {
    if (auto eng = s.lock())
      eng->unwatch(id);
  };
  co_return watch_stream(q);
}

} // namespace corodist::store
