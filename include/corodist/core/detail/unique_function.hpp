#pragma once
// A move-only type-erased callable (std::move_only_function is C++23).

#include <corodist/core/config.hpp>

#include <memory>
#include <type_traits>
#include <utility>

namespace corodist::detail {

template <typename Signature>
class unique_function;

template <typename R, typename... Args>
class unique_function<R(Args...)> {
public:
  unique_function() noexcept = default;

  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, unique_function>>>
  unique_function(F&& f) : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}

  unique_function(unique_function&&) noexcept = default;
  unique_function& operator=(unique_function&&) noexcept = default;

  explicit operator bool() const noexcept { return impl_ != nullptr; }

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

} // namespace corodist::detail
