#include <corodist/core/error.hpp>

#include "collective/reduce.hpp"

#include <algorithm>
#include <type_traits>

namespace corodist::collective::detail {

namespace {

// Integers wrap around (computed as unsigned: no undefined overflow).
template <typename T>
T add(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));
  else
    return a + b;
}

template <typename T>
T mul(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename T, typename F>
void apply(void* out_, const void* a_, const void* b_, std::size_t n, F f) noexcept {
  auto* out = static_cast<T*>(out_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = f(a[i], b[i]);
}

// 16-bit floats: computed in float, rounded back.
template <typename H, typename F>
void apply16(void* out_, const void* a_, const void* b_, std::size_t n, F f) noexcept {
  auto* out = static_cast<std::uint16_t*>(out_);
  const auto* a = static_cast<const std::uint16_t*>(a_);
  const auto* b = static_cast<const std::uint16_t*>(b_);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = H::from_float(f(H::to_float(a[i]), H::to_float(b[i])));
}

struct op_sum {
  template <typename T>
  T operator()(T a, T b) const noexcept { return add(a, b); }
};
struct op_product {
  template <typename T>
  T operator()(T a, T b) const noexcept { return mul(a, b); }
};
struct op_min {
  template <typename T>
  T operator()(T a, T b) const noexcept { return b < a ? b : a; }
};
struct op_max {
  template <typename T>
  T operator()(T a, T b) const noexcept { return a < b ? b : a; }
};

template <typename T, typename Op>
void kernel(void* out, const void* a, const void* b, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>)
    apply16<T>(out, a, b, n, Op{});
  else
    apply<T>(out, a, b, n, Op{});
}

template <typename T>
reduce_fn for_op(reduce_op op) {
  switch (op) {
  case reduce_op::sum:
  case reduce_op::avg: return &kernel<T, op_sum>;
  case reduce_op::product: return &kernel<T, op_product>;
  case reduce_op::min: return &kernel<T, op_min>;
  case reduce_op::max: return &kernel<T, op_max>;
  }
  throw usage_error("invalid reduce_op");
}

template <typename T>
void divide_as(const tensor_view& t, int d) {
  auto* p = static_cast<T*>(t.data());
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    for (std::size_t i = 0; i < t.count(); ++i)
      p[i].bits = T::from_float(T::to_float(p[i].bits) / static_cast<float>(d));
  } else {
    for (std::size_t i = 0; i < t.count(); ++i)
      p[i] /= static_cast<T>(d);
  }
}

// A power-of-two divisor multiplies by its exact reciprocal: the same
// result as the division, which the vector units do several times slower.
template <typename T>
void add_divided_as(void* out_, const void* a_, const void* b_, std::size_t n, int d) noexcept {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    auto* out = static_cast<std::uint16_t*>(out_);
    const auto* a = static_cast<const std::uint16_t*>(a_);
    const auto* b = static_cast<const std::uint16_t*>(b_);
    for (std::size_t i = 0; i < n; ++i) {
      const float sum = T::to_float(T::from_float(T::to_float(a[i]) + T::to_float(b[i])));
      out[i] = T::from_float(sum / static_cast<float>(d));
    }
  } else {
    auto* out = static_cast<T*>(out_);
    const auto* a = static_cast<const T*>(a_);
    const auto* b = static_cast<const T*>(b_);
    if ((d & (d - 1)) == 0) {
      const T r = T(1) / static_cast<T>(d);
      for (std::size_t i = 0; i < n; ++i)
        out[i] = (a[i] + b[i]) * r;
    } else {
      const T div = static_cast<T>(d);
      for (std::size_t i = 0; i < n; ++i)
        out[i] = (a[i] + b[i]) / div;
    }
  }
}

template <typename T>
void widen_as(const tensor_view& t, std::vector<std::int64_t>& out) {
  const auto* p = static_cast<const T*>(t.data());
  out.resize(t.count());
  for (std::size_t i = 0; i < t.count(); ++i)
    out[i] = static_cast<std::int64_t>(p[i]);
}

template <typename T>
void narrow_as(const std::vector<std::int64_t>& in, int d, const tensor_view& t) {
  auto* p = static_cast<T*>(t.data());
  for (std::size_t i = 0; i < t.count(); ++i)
    p[i] = static_cast<T>(in[i] / d);
}

} // namespace

reduce_fn reduce_function(dtype t, reduce_op op) {
  switch (t) {
  case dtype::float32: return for_op<float>(op);
  case dtype::float64: return for_op<double>(op);
  case dtype::float16: return for_op<float16>(op);
  case dtype::bfloat16: return for_op<bfloat16>(op);
  case dtype::int32: return for_op<std::int32_t>(op);
  case dtype::int64: return for_op<std::int64_t>(op);
  case dtype::uint8: return for_op<std::uint8_t>(op);
  }
  throw usage_error("invalid dtype");
}

void divide(const tensor_view& t, int d) {
  switch (t.type()) {
  case dtype::float32: return divide_as<float>(t, d);
  case dtype::float64: return divide_as<double>(t, d);
  case dtype::float16: return divide_as<float16>(t, d);
  case dtype::bfloat16: return divide_as<bfloat16>(t, d);
  default: throw usage_error("divide: not a floating dtype");
  }
}

void add_divided(dtype t, void* out, const void* a, const void* b, std::size_t n, int divisor) {
  switch (t) {
  case dtype::float32: return add_divided_as<float>(out, a, b, n, divisor);
  case dtype::float64: return add_divided_as<double>(out, a, b, n, divisor);
  case dtype::float16: return add_divided_as<float16>(out, a, b, n, divisor);
  case dtype::bfloat16: return add_divided_as<bfloat16>(out, a, b, n, divisor);
  default: throw usage_error("add_divided: not a floating dtype");
  }
}

void widen(const tensor_view& t, std::vector<std::int64_t>& out) {
  switch (t.type()) {
  case dtype::int32: return widen_as<std::int32_t>(t, out);
  case dtype::int64: return widen_as<std::int64_t>(t, out);
  case dtype::uint8: return widen_as<std::uint8_t>(t, out);
  default: throw usage_error("widen: not an integer dtype");
  }
}

void narrow_divided(const std::vector<std::int64_t>& in, int d, const tensor_view& t) {
  switch (t.type()) {
  case dtype::int32: return narrow_as<std::int32_t>(in, d, t);
  case dtype::int64: return narrow_as<std::int64_t>(in, d, t);
  case dtype::uint8: return narrow_as<std::uint8_t>(in, d, t);
  default: throw usage_error("narrow: not an integer dtype");
  }
}

} // namespace corodist::collective::detail
