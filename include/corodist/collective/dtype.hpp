#pragma once
/// \file
/// corodist::collective::dtype: the element types collectives understand,
/// their sizes and names, and the dtype of a C++ element type.

#include <corodist/core/config.hpp>

#include <corodist/collective/float16.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace corodist::collective {

/// Element type of a buffer (PyTorch's scalar types of the same names).
enum class dtype : std::uint8_t {
  float32,  ///< float
  float64,  ///< double
  float16,  ///< collective::float16 (IEEE binary16)
  bfloat16, ///< collective::bfloat16
  int32,    ///< std::int32_t
  int64,    ///< std::int64_t
  uint8,    ///< std::uint8_t
};

/// Returns the size of one element of `t` in bytes.
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
  case dtype::float32: return 4;
  case dtype::float64: return 8;
  case dtype::float16: return 2;
  case dtype::bfloat16: return 2;
  case dtype::int32: return 4;
  case dtype::int64: return 8;
  case dtype::uint8: return 1;
  }
  return 0;
}

/// Returns the name of `t` ("float32", ...), or "invalid".
constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
  case dtype::float32: return "float32";
  case dtype::float64: return "float64";
  case dtype::float16: return "float16";
  case dtype::bfloat16: return "bfloat16";
  case dtype::int32: return "int32";
  case dtype::int64: return "int64";
  case dtype::uint8: return "uint8";
  }
  return "invalid";
}

/// True for float32, float64, float16 and bfloat16.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}

/// `dtype_of<T>::value`: the dtype of C++ element type T (no member for other types).
template <typename T>
struct dtype_of {};
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::float32> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::float64> {};
template <> struct dtype_of<collective::float16> : std::integral_constant<dtype, dtype::float16> {};
template <> struct dtype_of<collective::bfloat16> : std::integral_constant<dtype, dtype::bfloat16> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::int32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::int64> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::uint8> {};

/// True when T is one of the element types above.
template <typename T>
concept element_type = requires { dtype_of<std::remove_cv_t<T>>::value; };

} // namespace corodist::collective
