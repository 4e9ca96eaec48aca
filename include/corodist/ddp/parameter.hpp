#pragma once
/// \file
/// corodist::ddp::parameter: one registered parameter of a replicated model —
/// its values, its gradient, its size, dtype and device.

#include <corodist/core/config.hpp>

#include <corodist/collective/device.hpp>
#include <corodist/collective/dtype.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

namespace corodist::ddp {

/// A parameter the reducer keeps in sync: `count` elements of `type` at
/// `values` (broadcast from rank 0 at construction) and its gradient at
/// `grad` (averaged over the ranks by every synchronised iteration). The
/// caller owns both and keeps them alive as long as the reducer. With
/// `reducer_options::gradient_as_bucket_view` the gradient lives in the
/// reducer's bucket memory instead (`reducer::gradient(i)`) and `grad` is not
/// used (it may be null). `name` only appears in errors.
struct parameter {
  void* values = nullptr;
  void* grad = nullptr;
  std::size_t count = 0;
  collective::dtype type = collective::dtype::float32;
  collective::device where = collective::device::cpu();
  std::string name;

  parameter() = default;

  /// A parameter of `count` elements of `type` (values and gradient) in `where`.
  parameter(void* values_, void* grad_, std::size_t count_, collective::dtype type_,
            collective::device where_ = collective::device::cpu(), std::string name_ = {})
      : values(values_), grad(grad_), count(count_), type(type_), where(where_), name(std::move(name_)) {}

  /// A host parameter from spans of a supported element type; `grad` may be
  /// empty (gradient_as_bucket_view), else it must have `values.size()` elements
  /// (the reducer checks that `count` fits both).
  template <collective::element_type T>
    requires(!std::is_const_v<T>)
  parameter(std::span<T> values_, std::span<T> grad_, std::string name_ = {})
      : values(values_.data()), grad(grad_.empty() ? nullptr : grad_.data()), count(values_.size()),
        type(collective::dtype_of<T>::value), name(std::move(name_)) {
    if (!grad_.empty() && grad_.size() != values_.size())
      count = 0; // refused by the reducer: "gradient size differs"
  }

  /// Size of the values (and of the gradient) in bytes.
  std::size_t bytes() const noexcept { return count * collective::element_size(type); }
};

} // namespace corodist::ddp
