#include <corodist/collective/work.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>

#include <corodist/collective/errors.hpp>

#include "collective/work_state.hpp"

#include <string_view>

namespace corodist::collective {

namespace detail {

bool work_state::complete(std::exception_ptr error) {
  std::optional<promise<void>> waiter;
  {
    std::lock_guard lk(mutex_);
    if (done_)
      return false;
    done_ = true;
    error_ = std::move(error);
    end_ = clock::now();
    if (start_ == clock::time_point{})
      start_ = end_;
    waiter = std::move(waiter_);
    waiter_.reset();
  }
  if (recorder_) { // before the waiters wake: a dump taken after the work completed shows it ended
    if (!error_) {
      recorder_->complete(handle_);
    } else {
      std::string text;
      const auto kind = error_kind(error_, text);
      recorder_->fail(handle_, text, kind);
    }
  }
  cv_.notify_all();
  if (waiter)
    waiter->set_value(); // resumes the awaiting coroutine on its executor
  return true;
}

std::string_view work_state::error_kind(const std::exception_ptr& e, std::string& text) {
  try {
    std::rethrow_exception(e);
  } catch (const rank_lost_error& x) {
    text = x.what();
    return "rank_lost";
  } catch (const collective_timeout_error& x) {
    text = x.what();
    return "timeout";
  } catch (const std::exception& x) {
    text = x.what();
    const std::string_view t = text;
    if (t.find("calls differ") != std::string_view::npos)
      return "mismatch";
    if (t.find("was aborted") != std::string_view::npos || t.find("is aborted") != std::string_view::npos)
      return "aborted";
    if (dynamic_cast<const timeout_error*>(&x))
      return "timeout";
    return "error";
  } catch (...) {
    text = "an exception of an unknown type";
    return "error";
  }
}

bool work_state::wait(std::optional<std::chrono::milliseconds> timeout) const {
  std::unique_lock lk(mutex_);
  if (!timeout) {
    cv_.wait(lk, [&] { return done_; });
    return true;
  }
  return cv_.wait_for(lk, *timeout, [&] { return done_; });
}

asio::awaitable<void> work_state::await() {
  std::exception_ptr error;
  std::optional<future<void>> pending;
  {
    std::lock_guard lk(mutex_);
    if (done_) {
      error = error_;
    } else {
      if (waiter_)
        throw usage_error("collective::work: awaited twice at once");
      promise<void> p;
      pending.emplace(p.get_future());
      waiter_.emplace(std::move(p));
    }
  }
  if (pending) {
    co_await pending->async_get();
    error = this->error();
  }
  if (error)
    std::rethrow_exception(error);
}

namespace {
asio::awaitable<void> await_state(std::shared_ptr<work_state> st) { co_await st->await(); }
} // namespace

} // namespace detail

work::work(std::shared_ptr<detail::work_state> state)
    : asio::awaitable<void>(detail::await_state(state)), state_(std::move(state)) {}

work::~work() = default;

void work::check_valid() const {
  if (!state_)
    throw usage_error("collective::work: no collective (default-constructed or moved-from)");
}

bool work::is_completed() const {
  check_valid();
  return state_->completed();
}

void work::get() const {
  check_valid();
  if (!state_->completed()) {
    if (corodist::detail::on_loop_thread())
      corodist::detail::throw_blocking_on_loop("collective::work::get()");
    state_->wait(std::nullopt);
  }
  if (auto e = state_->error())
    std::rethrow_exception(e);
}

void work::wait(corodist::timeout limit) const {
  check_valid();
  if (!state_->completed()) {
    if (corodist::detail::on_loop_thread())
      corodist::detail::throw_blocking_on_loop("collective::work::wait()");
    const auto wait_for = limit.is_finite() ? std::optional(limit.length()) : std::nullopt;
    if (!state_->wait(wait_for))
      throw timeout_error("collective::work::wait: " + state_->op() + " #" + std::to_string(state_->seq()) +
                          " still running after " + limit.str());
  }
  if (auto e = state_->error())
    std::rethrow_exception(e);
}

std::exception_ptr work::exception() const {
  check_valid();
  return state_->error();
}

std::chrono::nanoseconds work::duration() const {
  check_valid();
  return state_->duration();
}

std::uint64_t work::seq() const {
  check_valid();
  return state_->seq();
}

const std::string& work::op() const {
  check_valid();
  return state_->op();
}

int work::source_rank() const {
  check_valid();
  return state_->source();
}

} // namespace corodist::collective
