#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/store/watch_stream.hpp>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

namespace corodist::store {

namespace detail {

void watch_queue::push(watch_event e) {
  if (closed)
    return;
  events.push_back(std::move(e));
  if (wake) {
    auto w = std::move(wake);
    wake = {};
    w();
  }
}

void watch_queue::fail(std::exception_ptr error) {
  if (!failure)
    failure = std::move(error);
  if (wake) {
    auto w = std::move(wake);
    wake = {};
    w();
  }
}

namespace {
asio::awaitable<watch_event> next_event(std::shared_ptr<watch_queue> q, corodist::timeout limit) {
  const auto by = limit.from();
  using namespace asio::experimental::awaitable_operators;
  if (q->events.empty() && !q->failure && !q->closed) {
    promise<void> p;
    auto f = p.get_future();
    q->wake = [p = std::move(p)]() mutable { p.set_value(); };
    asio::steady_timer t(q->executor, by.at());
    co_await (f.async_get() || t.async_wait(asio::use_awaitable));
    q->wake = {};
  }
  if (!q->events.empty()) {
    watch_event e = std::move(q->events.front());
    q->events.pop_front();
    if (q->key_strip)
      e.key.erase(0, q->key_strip);
    co_return e;
  }
  if (q->failure)
    std::rethrow_exception(q->failure);
  if (q->closed)
    throw usage_error("watch_stream: closed");
  throw timeout_error("watch_stream::next: no event within " + limit.str());
}
} // namespace
} // namespace detail

asio::awaitable<watch_event> watch_stream::next(corodist::timeout limit) {
  if (!q_)
    throw usage_error("watch_stream: empty (moved-from or default-constructed)");
  const auto timeout = limit.or_else(default_timeout);
  auto q = q_;
  if ((co_await asio::this_coro::executor) == q->executor)
    co_return co_await detail::next_event(q, timeout);
  co_return co_await asio::co_spawn(q->executor, detail::next_event(q, timeout), asio::use_awaitable);
}

void watch_stream::close() noexcept {
  if (!q_)
    return;
  auto q = std::move(q_);
  q_.reset();
  try {
    asio::post(q->executor, [q] {
      q->closed = true;
      q->events.clear();
      if (q->on_close) {
        auto f = std::move(q->on_close);
        q->on_close = {};
        f();
      }
      if (q->wake) {
        auto w = std::move(q->wake);
        q->wake = {};
        w();
      }
    });
  } catch (...) {
  }
}

} // namespace corodist::store
