#pragma once
/// \file
/// corodist::unique_function: a move-only type-erased callable (what C++23
/// names std::move_only_function), for callbacks that own move-only state
/// (a promise, a connection's buffers). Used by every layer's callbacks.

#include <corodist/core/config.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace corodist {

/// A move-only callable of signature `Signature`; empty when default-made or
/// moved from (calling it then is undefined). Holds its target on the heap.
/// Not thread-safe: one thread at a time, like the callable it holds.
template <typename Signature>
class unique_function;

template <typename R, typename... Args>
class unique_function<R(Args...)> {
public:
  /// Empty.
  unique_function() noexcept = default;

  /// Holds `f` (moved or copied in). Throws std::bad_alloc.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, unique_function>>>
  unique_function(F&& f) : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}

  unique_function(unique_function&&) noexcept = default;
  unique_function& operator=(unique_function&&) noexcept = default;

  /// True when it holds a callable.
  explicit operator bool() const noexcept { return impl_ != nullptr; }

  /// Calls the held callable (it must hold one); throws what it throws.
  R operator()(Args... args) { return impl_->call(std::forward<Args>(args)...); }

private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual R call(Args... args) = 0;
  };
  template <typename F>
  struct model final : concept_t {
    explicit model(F&& f) : f_(std::move(f)) {}
    explicit model(const F& f) : f_(f) {}
    R call(Args... args) override { return f_(std::forward<Args>(args)...); }
    F f_;
  };
  std::unique_ptr<concept_t> impl_;
};

} // namespace corodist
