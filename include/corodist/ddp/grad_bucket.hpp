#pragma once
/// \file
/// corodist::ddp::grad_bucket and comm_hook: the bucket a communication hook
/// reduces (PyTorch's `GradBucket` and `register_comm_hook`).

#include <corodist/core/config.hpp>

#include <corodist/collective/process_group.hpp>
#include <corodist/collective/tensor_view.hpp>

#include <asio/awaitable.hpp>

#include <cstddef>
#include <functional>
#include <span>

namespace corodist::ddp {

/// One bucket handed to a communication hook: its flat buffer holds this
/// rank's gradients of the bucket's parameters, not yet divided by the world
/// size; the hook leaves the averaged values over all ranks in it.
class grad_bucket {
public:
  /// Bucket `index` of `bucket_count`, its buffer and parameters, the group
  /// and per-call options (made by the reducer for each hook call).
  grad_bucket(std::size_t index, std::size_t bucket_count, collective::tensor_view buffer,
              std::span<const std::size_t> parameters, collective::process_group& group,
              collective::call_options call) noexcept
      : index_(index), bucket_count_(bucket_count), buffer_(buffer), parameters_(parameters), group_(&group),
        call_(call) {}

  /// The bucket's index (buckets are launched in index order).
  std::size_t index() const noexcept { return index_; }
  /// True for the last bucket of the iteration.
  bool is_last() const noexcept { return index_ + 1 == bucket_count_; }
  /// The flat buffer (host memory, one dtype), reduced in place.
  collective::tensor_view buffer() const noexcept { return buffer_; }
  /// The parameters in the bucket, in buffer order.
  std::span<const std::size_t> parameters() const noexcept { return parameters_; }
  /// The reducer's process group.
  collective::process_group& group() const noexcept { return *group_; }
  /// The reducer's per-call options (its deadline), for the hook's collectives.
  collective::call_options call() const noexcept { return call_; }

private:
  std::size_t index_;
  std::size_t bucket_count_;
  collective::tensor_view buffer_;
  std::span<const std::size_t> parameters_;
  collective::process_group* group_;
  collective::call_options call_;
};

/// A communication hook: a coroutine, run on the reducer's loop, that reduces
/// a bucket in place (the averaged values over all ranks in `buffer()`).
/// Hooks of consecutive buckets run concurrently; each must issue its
/// collectives on `group()` before its first suspension that waits for
/// anything else, so that every rank issues them in bucket order.
/// The bucket is valid until the hook's coroutine ends. Cancellation: the
/// reducer never cancels a hook (its coroutine has no cancellation slot); it
/// runs to its end, and aborting the group is how to stop its collectives.
using comm_hook = std::function<asio::awaitable<void>(grad_bucket&)>;

} // namespace corodist::ddp
