#pragma once
/// \file
/// corodist::source_site: where a call was made (file and line), captured the
/// way `std::source_location` is — as a default argument, or a default
/// member initializer (then the place of the aggregate initialization: a
/// defaulted or braced options argument gives the caller's line). Its own
/// type because clang 14 with libstdc++ 12 has no `std::source_location`.

#include <corodist/core/config.hpp>

#include <cstdint>

namespace corodist {

/// A file and line; empty ("" and 0) when unknown.
class source_site {
public:
  constexpr source_site() noexcept = default;
  constexpr source_site(const char* file, std::uint_least32_t line) noexcept : file_(file), line_(line) {}

  /// The caller's file and line (as `std::source_location::current()`).
  [[nodiscard]] static constexpr source_site current(const char* file = __builtin_FILE(),
                                                      std::uint_least32_t line = __builtin_LINE()) noexcept {
    return {file, line};
  }

  /// The file's path as the compiler saw it ("" when unknown).
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  /// The line (0 when unknown).
  [[nodiscard]] constexpr std::uint_least32_t line() const noexcept { return line_; }

private:
  const char* file_ = "";
  std::uint_least32_t line_ = 0;
};

} // namespace corodist
