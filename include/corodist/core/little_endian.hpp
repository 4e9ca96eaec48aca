#pragma once
/// \file
/// corodist::store_le and corodist::load_le: integers in little-endian byte
/// order, the order of every corodist wire format (frame headers, hellos, rpc
/// payload prefixes and attachment references).

#include <corodist/core/config.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace corodist {

/// Writes the integer `v` to `p[0 .. sizeof(T))`, least significant byte
/// first. `p` needs no alignment. Never throws; any thread.
template <typename T>
inline void store_le(std::byte* p, T v) noexcept {
  static_assert(std::is_integral_v<T>, "store_le: an integer type");
  if constexpr (std::endian::native == std::endian::big) {
    using U = std::make_unsigned_t<T>;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      p[i] = static_cast<std::byte>((static_cast<U>(v) >> (8 * i)) & 0xff);
  } else {
    std::memcpy(p, &v, sizeof(T));
  }
}

/// Reads an integer of type T from `p[0 .. sizeof(T))`, least significant byte
/// first. `p` needs no alignment. Never throws; any thread.
template <typename T>
inline T load_le(const std::byte* p) noexcept {
  static_assert(std::is_integral_v<T>, "load_le: an integer type");
  if constexpr (std::endian::native == std::endian::big) {
    using U = std::make_unsigned_t<T>;
    U v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<U>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
    return static_cast<T>(v);
  } else {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
}

} // namespace corodist
