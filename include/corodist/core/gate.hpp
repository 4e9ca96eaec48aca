#pragma once
/// \file
/// corodist::gate: counts work in flight and lets a shutdown wait for it to drain.

#include <corodist/core/config.hpp>

#include <corodist/core/future.hpp>

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace corodist {

/// Counts work in flight (Seastar's gate): each piece of work holds a
/// `gate::holder` from `enter()` while it runs; `close()` refuses new work and
/// returns a future that is ready once the count is zero. `wait_idle()` waits
/// for zero without closing (work may enter again later). Thread-safe.
class gate {
public:
  /// Keeps the gate's count up while alive. Movable.
  class holder {
  public:
    holder() = default;
    holder(holder&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
    holder& operator=(holder&& o) noexcept {
      if (this != &o) {
        release();
        g_ = std::exchange(o.g_, nullptr);
      }
      return *this;
    }
    ~holder() { release(); }
    /// Leaves the gate now (idempotent).
    void release() noexcept {
      if (auto* g = std::exchange(g_, nullptr))
        g->leave();
    }

  private:
    friend class gate;
    explicit holder(gate* g) noexcept : g_(g) {}
    gate* g_ = nullptr;
  };

  /// `name` appears in the error of an enter() after close().
  explicit gate(std::string name = "gate") : name_(std::move(name)) {}
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;

  /// Counts one piece of work in. Throws `usage_error` naming the gate once it is closed.
  holder enter() {
    if (!try_enter())
      throw usage_error(name_ + " is closed");
    return holder(this);
  }

  /// Counts one piece of work in and returns true, or returns false when closed.
  /// Pair with leave().
  bool try_enter() noexcept {
    std::lock_guard lk(m_);
    if (closed_)
      return false;
    ++count_;
    return true;
  }

  /// Counts one piece of work out (after try_enter()).
  void leave() noexcept {
    std::vector<promise<void>> wake;
    {
      std::lock_guard lk(m_);
      if (--count_ == 0)
        wake.swap(idle_);
    }
    for (auto& p : wake)
      p.set_value();
  }

  /// Work in flight now.
  std::size_t count() const noexcept {
    std::lock_guard lk(m_);
    return count_;
  }

  /// True after close().
  bool closed() const noexcept {
    std::lock_guard lk(m_);
    return closed_;
  }

  /// A future that is ready once no work is in flight (at once if none is).
  future<void> wait_idle() {
    promise<void> p;
    auto f = p.get_future();
    std::lock_guard lk(m_);
    if (count_ == 0)
      p.set_value();
    else
      idle_.push_back(std::move(p));
    return f;
  }

  /// Refuses new work from now on; returns wait_idle(). Idempotent.
  future<void> close() {
    {
      std::lock_guard lk(m_);
      closed_ = true;
    }
    return wait_idle();
  }

private:
  mutable std::mutex m_;
  std::string name_;
  std::size_t count_ = 0;
  bool closed_ = false;
  std::vector<promise<void>> idle_;
};

} // namespace corodist
