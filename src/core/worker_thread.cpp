#include <corodist/core/error.hpp>
#include <corodist/core/worker_thread.hpp>

#include "core/log.hpp"

#include <pthread.h>

namespace corodist {

namespace {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
} // namespace

worker_thread::worker_thread(worker_thread_options opts) : opts_(std::move(opts)) {
  if (opts_.threads < 1)
    throw usage_error("worker_thread: threads must be at least 1 (got " + std::to_string(opts_.threads) + ")");
  threads_.reserve(static_cast<std::size_t>(opts_.threads));
  for (int i = 0; i < opts_.threads; ++i) {
    threads_.emplace_back([this] { run(); });
    auto name = opts_.name.substr(0, 15);
    ::pthread_setname_np(threads_.back().native_handle(), name.c_str());
  }
}

worker_thread::~worker_thread() {
  stop();
  for (auto& t : threads_)
    if (t.joinable())
      t.detach(); // only when stopped from one of its own threads
}

void worker_thread::post(unique_function<void()> job) {
  std::unique_lock lk(mutex_);
  if (stopping_)
    throw usage_error("worker_thread '" + opts_.name + "': post() after stop()");
  jobs_.push_back(std::move(job));
  queued_.fetch_add(1, std::memory_order_release);
  const bool wake = sleeping_ > 0;
  lk.unlock();
  if (wake)
    cv_.notify_one();
}

void worker_thread::stop() {
  {
    std::lock_guard lk(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (running_in_this_thread())
    return;
  for (auto& t : threads_)
    if (t.joinable())
      t.join();
}

bool worker_thread::running_in_this_thread() const noexcept {
  const auto me = std::this_thread::get_id();
  for (const auto& t : threads_)
    if (t.get_id() == me)
      return true;
  return false;
}

std::size_t worker_thread::queued() const {
  return queued_.load(std::memory_order_relaxed);
}

void worker_thread::run() noexcept {
  using clock = std::chrono::steady_clock;
  for (;;) {
    unique_function<void()> job;
    {
      std::unique_lock lk(mutex_);
      if (jobs_.empty() && !stopping_ && opts_.spin.count() > 0) {
        // Poll briefly before sleeping: a job posted within the spin window
        // is taken without a futex wake-up.
        lk.unlock();
        const auto until = clock::now() + opts_.spin;
        while (queued_.load(std::memory_order_acquire) == 0 && clock::now() < until)
          cpu_relax();
        lk.lock();
      }
      ++sleeping_;
      cv_.wait(lk, [&] { return !jobs_.empty() || stopping_; });
      --sleeping_;
      if (jobs_.empty())
        return; // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    try {
      job();
    } catch (const std::exception& e) {
      CORODIST_LOG_ERROR("worker_thread '{}': a job threw (dropped): {}", opts_.name, e.what());
    } catch (...) {
      CORODIST_LOG_ERROR("worker_thread '{}': a job threw a non-standard exception (dropped)", opts_.name);
    }
  }
}

} // namespace corodist
