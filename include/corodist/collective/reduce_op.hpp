#pragma once
/// \file
/// corodist::collective::reduce_op: how allreduce and reduce_scatter combine the ranks' values.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string_view>

namespace corodist::collective {

/// The element-wise reduction of allreduce and reduce_scatter.
enum class reduce_op : std::uint8_t {
  sum,     ///< a + b (integers wrap around on overflow)
  avg,     ///< the sum divided by the group size (integers: truncated toward zero,
           ///< summed in 64 bits first so that small types do not wrap)
  min,     ///< the smaller
  max,     ///< the larger
  product, ///< a * b (integers wrap around on overflow)
};

/// Returns the name of `op` ("sum", ...), or "invalid".
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
  case reduce_op::sum: return "sum";
  case reduce_op::avg: return "avg";
  case reduce_op::min: return "min";
  case reduce_op::max: return "max";
  case reduce_op::product: return "product";
  }
  return "invalid";
}

} // namespace corodist::collective
