#pragma once
/// \file
/// corodist::ddp::bucket_layout: which parameters share which gradient
/// bucket, in which order — computed from sizes, dtypes and devices, and
/// inspectable so that a caller that fuses its backward can cut it at bucket edges.

#include <corodist/core/config.hpp>

#include <corodist/collective/device.hpp>
#include <corodist/collective/dtype.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace corodist::ddp {

struct parameter;

/// The assignment of parameters to buckets. Buckets are reduced in index
/// order on every rank; bucket 0 is the one expected to be ready first.
struct bucket_layout {
  /// One bucket: parameters of one dtype and one device, packed in order.
  struct bucket {
    /// Parameter indices (registration order numbers), in bucket order.
    std::vector<std::size_t> parameters;
    /// Element offset of each parameter in the bucket (same order).
    std::vector<std::size_t> offsets;
    /// Total elements.
    std::size_t count = 0;
    collective::dtype type = collective::dtype::float32;
    collective::device where = collective::device::cpu();
    /// `count * element_size(type)`.
    std::size_t bytes() const noexcept { return count * collective::element_size(type); }
  };

  std::vector<bucket> buckets;

  /// Packs `params` in the order `order` (parameter indices, each once; empty:
  /// reverse registration order, as DDP expects gradients to become ready)
  /// into buckets: each (dtype, device) pair fills its own bucket, which is
  /// closed once it holds at least `first_cap_bytes` (its first bucket) or
  /// `cap_bytes` (later ones) — PyTorch's `compute_bucket_assignment_by_size`.
  /// Buckets are then ordered by the position of their first parameter in
  /// `order`. Throws `usage_error` if `order` is not a permutation of the indices.
  static bucket_layout compute(std::span<const parameter> params, std::span<const std::size_t> order,
                               std::size_t first_cap_bytes, std::size_t cap_bytes);

  /// The bucket of each parameter (indexed by parameter).
  std::vector<std::size_t> bucket_of(std::size_t parameter_count) const;

  /// A readable summary: "bucket 0 (float32 cpu, 4 params, 1048576 B): 9 8 7 6".
  std::string to_string() const;
};

} // namespace corodist::ddp
