#pragma once
/// \file
/// corodist::collective::device: where a buffer's memory lives (host or a CUDA device).

#include <corodist/core/config.hpp>

#include <string>

namespace corodist::collective {

/// The memory a buffer lives in: host memory (`device::cpu()`) or the memory
/// of CUDA device `index` (`device::cuda(i)`).
struct device {
  /// The kind of memory.
  enum class kind_type { cpu, cuda };

  kind_type kind = kind_type::cpu;
  /// CUDA device ordinal (0 for the host).
  int index = 0;

  /// Host memory.
  static constexpr device cpu() noexcept { return {}; }
  /// Memory of CUDA device `i`.
  static constexpr device cuda(int i = 0) noexcept { return {kind_type::cuda, i}; }

  /// Returns "cpu" or "cuda:<index>".
  std::string to_string() const { return kind == kind_type::cpu ? "cpu" : "cuda:" + std::to_string(index); }

  friend constexpr bool operator==(const device&, const device&) = default;
};

} // namespace corodist::collective
