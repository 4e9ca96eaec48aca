#include "store/local/engine_ops.hpp"

#include "core/deadline.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>

namespace corodist::store::detail {

engine_ops::engine_ops(asio::any_io_executor ex, std::string where)
    : ex_(std::move(ex)), engine_(std::make_shared<engine>(ex_)), waits_(ex_, std::move(where)) {}

asio::awaitable<void> engine_ops::until_present(const std::vector<std::string>& keys, corodist::deadline by) {
  const std::chrono::milliseconds timeout(by.to_wire()); // the engine's: 0 is none
  wait_log::entry logged(waits_, keys, timeout);
  promise<std::vector<std::string>> p;
  auto f = p.get_future();
  engine_->wait(keys, timeout, 0,
                [p = std::move(p)](std::vector<std::string>&&, std::vector<std::string>&& missing) mutable {
                  p.set_value(std::move(missing));
                });
  if (!f.is_ready())
    awaiting();
  auto missing = co_await f.async_get();
  if (!missing.empty())
    throw timeout_error(rules::timeout_message(missing, timeout));
}

asio::awaitable<std::string> engine_ops::do_get(std::string key, corodist::deadline by) {
  refresh();
  for (;;) { // (deleted again before this resumed: wait again)
    if (auto* v = engine_->get(key))
      co_return *v;
    const std::vector<std::string> keys{key};
    co_await until_present(keys, by);
  }
}

asio::awaitable<bool> engine_ops::do_check(std::vector<std::string> keys) {
  refresh();
  co_return engine_->check(keys);
}

asio::awaitable<void> engine_ops::do_wait(std::vector<std::string> keys, corodist::deadline by) {
  refresh();
  co_await until_present(keys, by);
}

asio::awaitable<std::int64_t> engine_ops::do_num_keys() {
  refresh();
  co_return static_cast<std::int64_t>(engine_->size());
}

asio::awaitable<std::vector<std::string>> engine_ops::do_multi_get(std::vector<std::string> keys,
                                                                   corodist::deadline by) {
  refresh();
  while (!engine_->check(keys))
    co_await until_present(keys, by);
  co_return engine_->values(keys);
}

asio::awaitable<std::vector<std::string>> engine_ops::do_list_keys(std::string prefix) {
  refresh();
  co_return engine_->list(prefix);
}

asio::awaitable<watch_stream> engine_ops::do_watch_key(std::string key) {
  refresh();
  auto q = std::make_shared<watch_queue>(ex_);
  const auto id = engine_->watch(key, 0, [w = std::weak_ptr<watch_queue>(q)](const watch_event& e) {
    if (auto q = w.lock())
      q->push(e);
  });
  q->on_close = [eng = std::weak_ptr<engine>(engine_), id] { // (on the executor)
    if (auto e = eng.lock())
      e->unwatch(id);
  };
  std::erase_if(watches_, [](auto& w) { return w.expired(); });
  watches_.push_back(q);
  awaiting();
  co_return watch_stream(std::move(q));
}

std::vector<std::shared_ptr<watch_queue>> engine_ops::open_watches() const {
  std::vector<std::shared_ptr<watch_queue>> out;
  for (auto& w : watches_)
    if (auto q = w.lock())
      out.push_back(std::move(q));
  return out;
}

} // namespace corodist::store::detail
