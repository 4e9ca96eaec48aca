#pragma once
/// \file
/// corodist::worker_thread: threads of their own that run blocking jobs in
/// FIFO order, off every event loop, and hand results back as futures that a
/// coroutine awaits on its own executor ("run off the loop, post back").

#include <corodist/core/config.hpp>

#include <corodist/core/unique_function.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/run_on.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace corodist {

/// How a worker_thread runs.
struct worker_thread_options {
  static constexpr std::chrono::microseconds default_spin{0};

  /// Threads taking jobs from the one queue (at least 1). Jobs start in the
  /// order they were posted; with more than one thread they may overlap.
  int threads = 1;
  /// Name given to the threads (`pthread_setname_np`, at most 15 characters kept).
  std::string name = "corodist-worker";
  /// After a job, a thread polls the queue this long before sleeping, so that
  /// a job posted right after costs no wake-up (on a VM where waking a
  /// sleeping thread costs tens of microseconds). Zero: sleep at once.
  std::chrono::microseconds spin = default_spin;
};

/// Threads that run posted blocking functions (a Gloo call, a file read)
/// outside any event loop. `submit` returns a `corodist::future`: a coroutine
/// awaits it (`co_await f.async_get()`) and resumes on its own executor, a
/// plain thread calls `get()`. (`run_on` runs a function on an executor that
/// exists; this owns its threads, for work that blocks them.) The threads are not event-loop threads, so blocking facades
/// (`sync_store`, `future::get`) work inside jobs. Thread-safe.
class worker_thread {
public:
  /// Starts the threads. Throws `usage_error` if `opts.threads < 1`.
  explicit worker_thread(worker_thread_options opts = {});

  /// Runs the jobs already posted, then joins the threads (see `stop`).
  ~worker_thread();

  worker_thread(const worker_thread&) = delete;
  worker_thread& operator=(const worker_thread&) = delete;

  /// Queues `job`; it runs on one of the threads after the jobs posted before
  /// it have started. A job must not throw (an escaping exception is logged
  /// and dropped). Throws `usage_error` after `stop()`.
  void post(unique_function<void()> job);

  /// Queues `fn` and returns a future of its result (or of the exception it
  /// throws). Throws `usage_error` after `stop()`.
  /// Cancellation: not cancellable: a queued job runs to its end; cancelling
  /// the wait on the future (see `future::async_get`) ends only the wait.
  template <typename F>
  auto submit(F fn) -> future<std::invoke_result_t<F&>> {
    auto [job, f] = detail::packaged_job(std::move(fn));
    post(std::move(job));
    return std::move(f);
  }

  /// Refuses new jobs, lets the threads finish every queued job, and joins
  /// them. Idempotent. Called from one of its own threads (a job stopping its
  /// worker), it only refuses new jobs; the destructor then detaches.
  void stop();

  /// True when the calling thread is one of this worker's threads.
  bool running_in_this_thread() const noexcept;

  /// Jobs queued and not yet started.
  std::size_t queued() const;

private:
  void run() noexcept;

  worker_thread_options opts_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<unique_function<void()>> jobs_;
  std::atomic<std::size_t> queued_{0}; // jobs_.size(), readable without the lock
  bool stopping_ = false;
  int sleeping_ = 0;
  std::vector<std::thread> threads_;
};

} // namespace corodist
