#pragma once
/// \file
/// corodist::collective::tensor_view: a typed span over caller memory (host or
/// CUDA device) that collectives read and write in place.

#include <corodist/core/config.hpp>

#include <corodist/collective/device.hpp>
#include <corodist/collective/dtype.hpp>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace corodist::collective {

/// A non-owning view of `count()` elements of `type()` at `data()`, in the
/// memory of `where()`. Collectives read and write it in place; the caller
/// keeps the memory alive, and does not touch it, until the collective's
/// `work` has completed (successfully or not) — also when the awaiting
/// coroutine is cancelled, which does not stop the collective.
class tensor_view {
public:
  /// An empty view (no data, zero elements, float32, host).
  tensor_view() = default;

  /// A view of `count` elements of `type` at `data` in `where`.
  tensor_view(void* data, std::size_t count, dtype type, device where = device::cpu()) noexcept
      : data_(data), count_(count), type_(type), device_(where) {}

  /// A view of a span of a supported element type (float, double, float16,
  /// bfloat16, int32_t, int64_t, uint8_t), in host memory unless `where` says otherwise.
  template <element_type T>
    requires(!std::is_const_v<T>)
  tensor_view(std::span<T> s, device where = device::cpu()) noexcept
      : data_(s.data()), count_(s.size()), type_(dtype_of<T>::value), device_(where) {}

  /// A view of a whole vector's elements (host memory).
  template <element_type T, typename Alloc>
  tensor_view(std::vector<T, Alloc>& v) noexcept // NOLINT: implicit on purpose
      : data_(v.data()), count_(v.size()), type_(dtype_of<T>::value), device_(device::cpu()) {}

  /// The first element.
  void* data() const noexcept { return data_; }
  /// The number of elements.
  std::size_t count() const noexcept { return count_; }
  /// The element type.
  dtype type() const noexcept { return type_; }
  /// Where the memory lives.
  device where() const noexcept { return device_; }
  /// `count() * element_size(type())`.
  std::size_t bytes() const noexcept { return count_ * element_size(type_); }

  /// The `n` elements from element `offset` on (the caller keeps within bounds).
  tensor_view slice(std::size_t offset, std::size_t n) const noexcept {
    return {static_cast<std::byte*>(data_) + offset * element_size(type_), n, type_, device_};
  }

private:
  void* data_ = nullptr;
  std::size_t count_ = 0;
  dtype type_ = dtype::float32;
  device device_{};
};

} // namespace corodist::collective
