#include <corodist/ddp/default_hooks.hpp>

#include "ddp/grad_ops.hpp"

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/float16.hpp>

#include <vector>

namespace corodist::ddp::hooks {

namespace cc = corodist::collective;

namespace {

bool on_cuda(const cc::tensor_view& t) { return t.where().kind == cc::device::kind_type::cuda; }

// The stream of a CUDA bucket's work: the one its collectives follow (the reducer's).
cc::cuda_stream stream_of(const grad_bucket& b) {
  return cc::cuda_stream::borrow(b.buffer().where().index, b.call().stream);
}

} // namespace

comm_hook allreduce() {
  return [](grad_bucket& b) -> asio::awaitable<void> {
    const auto buf = b.buffer();
    if (detail::divide_before_sum(buf.type())) {
      if (on_cuda(buf))
        stream_of(b).convert(buf, buf, b.group().size());
      else
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
    if (on_cuda(buf)) {
      // On the device: the casts are the convert kernel on the bucket's stream;
      // the half buffer is stream-ordered memory, freed after the cast back.
      const auto s = stream_of(b);
      auto half = cc::device_buffer::allocate_async(s, buf.count() * sizeof(cc::float16));
      const cc::tensor_view h(half.data(), buf.count(), cc::dtype::float16, buf.where());
      s.convert(buf, h, b.group().size());
      std::exception_ptr failed;
      try {
        co_await b.group().allreduce(h, cc::reduce_op::sum, b.call());
      } catch (...) {
        failed = std::current_exception();
      }
      if (failed) {
        half.leak(); // a collective that failed may still write it: never handed out again
        std::rethrow_exception(failed);
      }
      s.convert(h, buf, 1); // the allreduce has completed: queued after it
      co_return;
    }
    std::vector<cc::float16> half(buf.count());
    detail::to_float16(buf, half.data(), b.group().size());
    co_await b.group().allreduce(cc::tensor_view(std::span<cc::float16>(half)), cc::reduce_op::sum, b.call());
    detail::from_float16(half.data(), buf);
  };
}

} // namespace corodist::ddp::hooks
