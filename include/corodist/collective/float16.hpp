#pragma once
/// \file
/// corodist::collective::float16 and bfloat16: 16-bit floating-point element
/// types (IEEE binary16 and bfloat16) for buffers of those dtypes, with
/// conversions to and from float (round to nearest even).

#include <corodist/core/config.hpp>

#include <bit>
#include <cstdint>
#include <cstring>

namespace corodist::collective {

/// IEEE 754 binary16 (CUDA's `__half`, PyTorch's `torch.float16`): 1 sign,
/// 5 exponent and 10 mantissa bits. Holds its bits; converts to and from float.
struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  /// Rounds `f` to the nearest float16 (ties to even; overflow gives infinity).
  explicit float16(float f) noexcept : bits(from_float(f)) {}
  /// Returns the exact float value.
  explicit operator float() const noexcept { return to_float(bits); }

  /// The float16 bits nearest to `f` (ties to even; NaN stays NaN).
  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) // inf or NaN
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u) // rounds to >= 65520: overflow
      return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (abs < 0x38800000u) { // below the smallest normal half: subnormal or zero
      if (abs < 0x33000000u) // below half of the smallest subnormal: zero
        return static_cast<std::uint16_t>(sign);
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      const int shift = 126 - static_cast<int>(abs >> 23); // 14 + (113 - exp)
      const std::uint32_t half = mant >> shift;
      const std::uint32_t rest = mant & ((1u << shift) - 1);
      const std::uint32_t mid = 1u << (shift - 1);
      const std::uint32_t rounded = half + ((rest > mid || (rest == mid && (half & 1u))) ? 1u : 0u);
      return static_cast<std::uint16_t>(sign | rounded);
    }
    // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits.
    const std::uint32_t rebased = abs - 0x38000000u;
    const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (rounded >> 13));
  }

  /// The float value of float16 bits `h` (exact).
  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) // inf or NaN
      return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) { // zero or subnormal: mant * 2^-24
      const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

/// bfloat16 (PyTorch's `torch.bfloat16`): the upper half of a float32 (1 sign,
/// 8 exponent and 7 mantissa bits). Holds its bits; converts to and from float.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  /// Rounds `f` to the nearest bfloat16 (ties to even; NaN stays NaN).
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  /// Returns the exact float value.
  explicit operator float() const noexcept { return to_float(bits); }

  /// The bfloat16 bits nearest to `f`.
  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) // NaN: keep it quiet and a NaN
      return static_cast<std::uint16_t>((x >> 16) | 0x40u);
    return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }

  /// The float value of bfloat16 bits `b` (exact).
  static float to_float(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
};

} // namespace corodist::collective
