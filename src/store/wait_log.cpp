#include "store/wait_log.hpp"

#include "core/log.hpp"

#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace corodist::store::detail {

/// The long waits of every store on one execution context, and the one timer
/// that wakes for the next warning due. A service of the context: it goes
/// (timer first, at shutdown) with the context, not with the stores. A mutex
/// guards the index and the timer: stores on different strands of one
/// multi-threaded context share them. The index is a binary min-heap of the
/// entries on their next warning's due time (each entry knows its slot): a
/// wait comes and goes in O(log waits), and a tick costs the entries due.
class wait_log::monitor : public asio::execution_context::service {
public:
  static asio::execution_context::id id;

  explicit monitor(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

  void add(entry& e, const asio::any_io_executor& ex) {
    std::lock_guard lock(mutex_);
    push(e);
    if (shut_)
      return;
    if (!timer_)
      timer_.emplace(ex);
    if (!armed_ || e.due_ < armed_at_) // an armed timer that fires before this one's warning is due will see it
      arm(e.due_);
  }

  void remove(entry& e) {
    std::lock_guard lock(mutex_);
    erase(e);
    // Nothing left to warn about: drop the pending wake-up, so that a context
    // with no other work ends now (an embedded loop's run() returns), not when
    // the next warning would have been due.
    if (due_.empty() && armed_ && timer_ && !shut_) {
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

  // The index; call with mutex_ held.
  void place(std::size_t slot) noexcept { due_[slot]->slot_ = slot; }

  void up(std::size_t slot) noexcept {
    while (slot > 0) {
      const auto parent = (slot - 1) / 2;
      if (!(due_[slot]->due_ < due_[parent]->due_))
        break;
      std::swap(due_[slot], due_[parent]);
      place(slot);
      slot = parent;
    }
    place(slot);
  }

  void down(std::size_t slot) noexcept {
    const auto n = due_.size();
    for (;;) {
      auto least = slot;
      const auto l = 2 * slot + 1;
      if (l < n && due_[l]->due_ < due_[least]->due_)
        least = l;
      if (l + 1 < n && due_[l + 1]->due_ < due_[least]->due_)
        least = l + 1;
      if (least == slot)
        break;
      std::swap(due_[slot], due_[least]);
      place(slot);
      slot = least;
    }
    place(slot);
  }

  void push(entry& e) {
    due_.push_back(&e);
    up(due_.size() - 1);
  }

  void erase(entry& e) noexcept {
    const auto slot = e.slot_;
    const auto last = due_.size() - 1;
    if (slot != last) {
      due_[slot] = due_[last];
      due_.pop_back();
      if (slot > 0 && due_[slot]->due_ < due_[(slot - 1) / 2]->due_)
        up(slot);
      else
        down(slot);
    } else {
      due_.pop_back();
    }
    if (due_.empty() && due_.capacity() > 4096)
      due_.shrink_to_fit();
  }

  // Call with mutex_ held. The timer fires a little after `at` (a fifth of
  // the first warning's delay, at most 1 s): the waits due meanwhile warn in
  // the same round, so waits that began over a span of time (ranks
  // connecting one after another) share lines.
  void arm(std::chrono::steady_clock::time_point at) {
    armed_ = true;
    armed_at_ = at;
    timer_->expires_at(at + std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1),
                                                                         warnings().first / 5));
    timer_->async_wait([this](std::error_code ec) {
      if (!ec)
        tick();
      // else: re-armed, or the context is going
    });
  }

  // Whether two entries warn in one line: the same keys where they are
  // awaited (the stores of many ranks in one process share a line).
  static bool same_line(const entry* a, const entry* b) {
    return (a->log_ == b->log_ || a->log_->where_ == b->log_->where_) && std::ranges::equal(a->keys_, b->keys_);
  }
  static bool line_before(const entry* a, const entry* b) {
    if (a->log_ != b->log_ && a->log_->where_ != b->log_->where_)
      return a->log_->where_ < b->log_->where_;
    return std::ranges::lexicographical_compare(a->keys_, b->keys_);
  }

  void tick() {
    std::lock_guard lock(mutex_);
    if (shut_)
      return;
    armed_ = false;
    if (due_.empty())
      return; // armed again by the next long wait
    const auto now = std::chrono::steady_clock::now();
    // The entries due, out of the index; their lines grouped by log, timeout and keys.
    ready_.clear();
    while (!due_.empty() && due_.front()->due_ <= now) {
      ready_.push_back(due_.front());
      erase(*due_.front());
    }
    std::sort(ready_.begin(), ready_.end(), line_before);
    for (std::size_t i = 0; i < ready_.size();) {
      auto j = i + 1;
      auto oldest = ready_[i]->since_;
      auto newest = oldest;
      deadlines d;
      d.add(ready_[i]->timeout_);
      for (; j < ready_.size() && same_line(ready_[i], ready_[j]); ++j) {
        oldest = std::min(oldest, ready_[j]->since_);
        newest = std::max(newest, ready_[j]->since_);
        d.add(ready_[j]->timeout_);
      }
      warn(*ready_[i], j - i, now - newest, now - oldest, d);
      i = j;
    }
    for (auto* e : ready_) {
      e->due_ += e->every_;
      push(*e);
    }
    ready_.clear();
    if (ready_.capacity() > 4096)
      ready_.shrink_to_fit();
    arm(due_.front()->due_);
  }

  // The timeouts of the waits of one line.
  struct deadlines {
    std::chrono::milliseconds shortest{0}, longest{0}; // of those with a timeout
    bool some_without = false;

    void add(std::chrono::milliseconds t) {
      if (t.count() <= 0) {
        some_without = true;
        return;
      }
      shortest = shortest.count() == 0 ? t : std::min(shortest, t);
      longest = std::max(longest, t);
    }

    std::string text() const {
      if (longest.count() == 0)
        return "no deadline";
      auto s = "gives up after " + duration_text(shortest);
      if (longest != shortest)
        s += " to " + duration_text(longest);
      return some_without ? s + ", some never" : s;
    }
  };

  // One line for `count` waits like `e`, which have waited from `least` to `most`.
  static void warn(const entry& e, std::size_t count, std::chrono::steady_clock::duration least,
                   std::chrono::steady_clock::duration most, const deadlines& d) {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const auto shortest = duration_text(duration_cast<milliseconds>(least));
    const auto longest = duration_text(duration_cast<milliseconds>(most));
    const auto deadline = d.text();
    const char* noun = e.keys_.size() == 1 ? "key" : "keys";
    if (count == 1)
      CORODIST_LOG_WARN("store: still waiting for {} {} at {} after {} ({})", noun, key_list(e.keys_),
                        e.log_->where_, longest, deadline);
    else
      CORODIST_LOG_WARN("store: {} waits still waiting for {} {} at {} after {} ({})", count, noun, key_list(e.keys_),
                        e.log_->where_, shortest == longest ? longest : shortest + " to " + longest, deadline);
  }

  std::mutex mutex_;
  std::optional<asio::steady_timer> timer_; // made on first use
  std::vector<entry*> due_;                 // min-heap on due_
  std::vector<entry*> ready_;               // (a tick's entries due; kept for its capacity)
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
