#include <corodist/ddp/default_hooks.hpp>

#include "ddp/grad_ops.hpp"

#include <corodist/collective/float16.hpp>

#include <vector>

namespace corodist::ddp::hooks {

namespace cc = corodist::collective;

comm_hook allreduce() {
  return [](grad_bucket& b) -> asio::awaitable<void> {
    const auto buf = b.buffer();
    if (detail::divide_before_sum(buf.type())) {
      detail::copy_divided(buf.data(), buf.data(), buf.count(), buf.type(), b.group().size());
      co_await b.group().allreduce(buf, cc::reduce_op::sum, b.call());
    } else {
      co_await b.group().allreduce(buf, cc::reduce_op::avg, b.call());
    }
  };
}

comm_hook fp16_compress() {
  return [](grad_bucket& b) -> asio::awaitable<void> {
    const auto buf = b.buffer();
    if (!cc::is_floating(buf.type())) {
      co_await b.group().allreduce(buf, cc::reduce_op::avg, b.call());
      co_return;
    }
    // Compress (dividing first, as PyTorch's fp16_compress_hook), reduce, decompress.
    std::vector<cc::float16> half(buf.count());
    detail::to_float16(buf, half.data(), b.group().size());
    co_await b.group().allreduce(cc::tensor_view(std::span<cc::float16>(half)), cc::reduce_op::sum, b.call());
    detail::from_float16(half.data(), buf);
  };
}

} // namespace corodist::ddp::hooks
