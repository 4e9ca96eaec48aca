#include "store/wait_log.hpp"

#include "core/log.hpp"

#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

namespace corodist::store::detail {

/// The long waits of every store on one execution context, and the one timer
/// that wakes for the next warning due. A service of the context: it goes
/// (timer first, at shutdown) with the context, not with the stores. A mutex
/// guards the list and the timer: stores on different strands of one
/// multi-threaded context share them.
class wait_log::monitor : public asio::execution_context::service {
public:
  static asio::execution_context::id id;

  explicit monitor(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

  void add(entry& e, const asio::any_io_executor& ex) {
    std::lock_guard lock(mutex_);
    e.next_ = head_;
    if (head_)
      head_->prev_ = &e;
    head_ = &e;
    if (shut_)
      return;
    if (!timer_)
      timer_.emplace(ex);
    if (!armed_ || e.due_ < armed_at_) // an armed timer that fires before this one's warning is due will see it
      arm(e.due_);
  }

  void remove(entry& e) {
    std::lock_guard lock(mutex_);
    if (e.prev_)
      e.prev_->next_ = e.next_;
    else
      head_ = e.next_;
    if (e.next_)
      e.next_->prev_ = e.prev_;
    // Nothing left to warn about: drop the pending wake-up, so that a context
    // with no other work ends now (an embedded loop's run() returns), not when
    // the next warning would have been due.
    if (!head_ && armed_ && timer_ && !shut_) {
      timer_->cancel();
      armed_ = false;
    }
  }

private:
  void shutdown() override {
    std::lock_guard lock(mutex_);
    shut_ = true;
    timer_.reset();
  }

  // Call with mutex_ held.
  void arm(std::chrono::steady_clock::time_point at) {
    armed_ = true;
    armed_at_ = at;
    timer_->expires_at(at);
    timer_->async_wait([this](std::error_code ec) {
      if (!ec)
        tick();
      // else: re-armed, or the context is going
    });
  }

  void tick() {
    std::lock_guard lock(mutex_);
    if (shut_)
      return;
    armed_ = false;
    if (!head_)
      return; // armed again by the next long wait
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto* e = head_; e; e = e->next_) {
      if (e->due_ <= now) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - e->since_);
        CORODIST_LOG_WARN("store: still waiting for {} {} at {} after {} ({})", e->keys_.size() == 1 ? "key" : "keys",
                          key_list(e->keys_), e->log_->where_, duration_text(waited),
                          e->timeout_.count() > 0 ? "gives up after " + duration_text(e->timeout_) : "no deadline");
        e->due_ += e->every_;
      }
      next = std::min(next, e->due_);
    }
    arm(next);
  }

  std::mutex mutex_;
  std::optional<asio::steady_timer> timer_; // made on first use
  entry* head_ = nullptr;
  bool armed_ = false;
  std::chrono::steady_clock::time_point armed_at_;
  bool shut_ = false;
};

asio::execution_context::id wait_log::monitor::id;

namespace {
std::atomic<std::int64_t> first_ms{warning_schedule::default_first.count()};
std::atomic<std::int64_t> every_ms{warning_schedule::default_every.count()};
} // namespace

warning_schedule warnings() noexcept {
  return {std::chrono::milliseconds(first_ms.load(std::memory_order_relaxed)),
          std::chrono::milliseconds(every_ms.load(std::memory_order_relaxed))};
}

warning_schedule set_warnings(warning_schedule s) noexcept {
  return {std::chrono::milliseconds(first_ms.exchange(s.first.count(), std::memory_order_relaxed)),
          std::chrono::milliseconds(every_ms.exchange(s.every.count(), std::memory_order_relaxed))};
}

wait_log::wait_log(asio::any_io_executor ex, std::string where)
    : ex_(std::move(ex)), monitor_(&asio::use_service<monitor>(asio::query(ex_, asio::execution::context))),
      where_(std::move(where)) {}

wait_log::entry::entry(wait_log& log, std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  const auto schedule = warnings();
  if (timeout.count() > 0 && timeout <= schedule.first)
    return;
  monitor_ = log.monitor_;
  log_ = &log;
  keys_ = keys;
  timeout_ = timeout;
  every_ = schedule.every;
  since_ = std::chrono::steady_clock::now();
  due_ = since_ + schedule.first;
  monitor_->add(*this, log.ex_);
}

wait_log::entry::~entry() {
  if (monitor_)
    monitor_->remove(*this);
}

std::string key_list(std::span<const std::string> keys, std::size_t max) {
  std::string m;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == max) {
      m += ", ... (" + std::to_string(keys.size()) + " in all)";
      break;
    }
    m += (i ? ", " : "") + keys[i];
  }
  return m;
}

std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() >= 10'000)
    return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

} // namespace corodist::store::detail
