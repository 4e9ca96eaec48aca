#include "ddp/grad_ops.hpp"

#include "collective/reduce.hpp"

#include <corodist/core/error.hpp>

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace corodist::ddp::detail {

namespace cc = corodist::collective;

namespace {

bool power_of_two(int d) { return d > 0 && (d & (d - 1)) == 0; }

// `dst` may be `src` (in place). A power-of-two divisor multiplies by its
// exact reciprocal (the same result, several times faster than a division
// per element); any other divides.
template <typename T>
void copy_divided_as(void* dst, const void* src, std::size_t n, int d) {
  auto* o = static_cast<T*>(dst);
  const auto* in = static_cast<const T*>(src);
  if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>) {
    for (std::size_t i = 0; i < n; ++i)
      o[i].bits = T::from_float(T::to_float(in[i].bits) / static_cast<float>(d));
  } else if (power_of_two(d)) {
    const T r = T(1) / static_cast<T>(d);
    for (std::size_t i = 0; i < n; ++i)
      o[i] = in[i] * r;
  } else {
    const T div = static_cast<T>(d);
    for (std::size_t i = 0; i < n; ++i)
      o[i] = in[i] / div;
  }
}

template <typename T>
float as_float(const void* p, std::size_t i) {
  if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>)
    return T::to_float(static_cast<const T*>(p)[i].bits);
  else
    return static_cast<float>(static_cast<const T*>(p)[i]);
}

template <typename T>
void store_float(void* p, std::size_t i, float v) {
  if constexpr (std::is_same_v<T, cc::float16> || std::is_same_v<T, cc::bfloat16>)
    static_cast<T*>(p)[i].bits = T::from_float(v);
  else
    static_cast<T*>(p)[i] = static_cast<T>(v);
}

template <typename T>
void to_float16_as(const cc::tensor_view& t, cc::float16* out, int d) {
  const float div = static_cast<float>(d);
  for (std::size_t i = 0; i < t.count(); ++i)
    out[i].bits = cc::float16::from_float(as_float<T>(t.data(), i) / div);
}

template <typename T>
void from_float16_as(const cc::float16* in, const cc::tensor_view& t) {
  for (std::size_t i = 0; i < t.count(); ++i)
    store_float<T>(t.data(), i, cc::float16::to_float(in[i].bits));
}

} // namespace

void copy_gradient(void* dst, const void* src, std::size_t bytes) noexcept {
#if defined(__SSE2__)
  if (bytes >= streaming_copy_min) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16; // streaming stores are aligned
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    for (std::size_t left = bytes / 64; left > 0; --left, d += 64, s += 64) {
      const auto* in = reinterpret_cast<const __m128i*>(s);
      auto* out = reinterpret_cast<__m128i*>(d);
      const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1), c = _mm_loadu_si128(in + 2),
                    e = _mm_loadu_si128(in + 3);
      _mm_stream_si128(out, a);
      _mm_stream_si128(out + 1, b);
      _mm_stream_si128(out + 2, c);
      _mm_stream_si128(out + 3, e);
    }
    _mm_sfence(); // the streamed bytes are visible before anything that follows
    std::memcpy(d, s, bytes % 64);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void copy_divided(void* dst, const void* src, std::size_t n, cc::dtype type, int divisor) {
  if (divisor == 1) {
    if (dst != src)
      std::memcpy(dst, src, n * cc::element_size(type));
    return;
  }
  switch (type) {
  case cc::dtype::float32: return copy_divided_as<float>(dst, src, n, divisor);
  case cc::dtype::float64: return copy_divided_as<double>(dst, src, n, divisor);
  case cc::dtype::float16: return copy_divided_as<cc::float16>(dst, src, n, divisor);
  case cc::dtype::bfloat16: return copy_divided_as<cc::bfloat16>(dst, src, n, divisor);
  default: throw usage_error("ddp: gradients must have a floating dtype");
  }
}

bool divide_before_sum(cc::dtype type) { return cc::is_floating(type) && cc::element_size(type) == 2; }

void to_float16(const cc::tensor_view& t, cc::float16* out, int divisor) {
  switch (t.type()) {
  case cc::dtype::float32: return to_float16_as<float>(t, out, divisor);
  case cc::dtype::float64: return to_float16_as<double>(t, out, divisor);
  case cc::dtype::float16: return to_float16_as<cc::float16>(t, out, divisor);
  case cc::dtype::bfloat16: return to_float16_as<cc::bfloat16>(t, out, divisor);
  default: throw usage_error("ddp: fp16 compression of a non-floating bucket");
  }
}

void from_float16(const cc::float16* in, const cc::tensor_view& t) {
  switch (t.type()) {
  case cc::dtype::float32: return from_float16_as<float>(in, t);
  case cc::dtype::float64: return from_float16_as<double>(in, t);
  case cc::dtype::float16: return from_float16_as<cc::float16>(in, t);
  case cc::dtype::bfloat16: return from_float16_as<cc::bfloat16>(in, t);
  default: throw usage_error("ddp: fp16 compression of a non-floating bucket");
  }
}

} // namespace corodist::ddp::detail
