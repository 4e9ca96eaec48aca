#pragma once
/// \file
/// The built-in communication hooks (PyTorch's `default_hooks`).

#include <corodist/core/config.hpp>

#include <corodist/ddp/grad_bucket.hpp>

namespace corodist::ddp::hooks {

/// Divides the bucket by the world size and allreduces it (the reducer's own
/// behaviour without a hook, as a hook).
comm_hook allreduce();

/// fp16 compression: casts the bucket to float16 (dividing by the world size
/// first), allreduces the half-size buffer, and writes the result back in the
/// bucket's dtype. Results are within float16 precision of the exact mean.
/// Buckets of integer dtypes are allreduced uncompressed.
comm_hook fp16_compress();

} // namespace corodist::ddp::hooks
