// The rooted collectives on Gloo: gather and scatter (Gloo's algorithms, as
// PyTorch's ProcessGroupGloo runs them), and reduce to a root (avg via the
// sum; integers averaged in int64).
#include "collective/gloo/algorithms.hpp"
#include "collective/reduce.hpp"

#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace corodist::collective::detail {

void gather(const gloo_call& gc, const tensor_view& in, const tensor_view& out, int root) {
  if (in.count() == 0)
    return;
  auto& o = kept<gloo::GatherOptions>(gc, gc.context);
  const auto esize = element_size(in.type());
  set_input(o, in.data(), in.count(), esize);
  if (gc.context->rank == root)
    set_output(o, out.data(), out.count(), esize);
  o.setRoot(root);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::gather(o);
}

void scatter(const gloo_call& gc, const tensor_view& in, const tensor_view& out, int root) {
  if (out.count() == 0)
    return;
  auto& o = kept<gloo::ScatterOptions>(gc, gc.context);
  const auto esize = element_size(out.type());
  if (gc.context->rank == root) {
    // Gloo takes one pointer per rank, each to `out.count()` elements.
    std::vector<std::uint8_t*> blocks;
    for (int r = 0; r < gc.context->size; ++r)
      blocks.push_back(static_cast<std::uint8_t*>(in.data()) + static_cast<std::size_t>(r) * out.bytes());
    switch (esize) {
    case 1: o.setInputs(blocks, out.count()); break;
    case 2: o.setInputs(reinterpret_cast<std::uint16_t**>(blocks.data()), blocks.size(), out.count()); break;
    case 4: o.setInputs(reinterpret_cast<std::uint32_t**>(blocks.data()), blocks.size(), out.count()); break;
    default: o.setInputs(reinterpret_cast<std::uint64_t**>(blocks.data()), blocks.size(), out.count()); break;
    }
  }
  set_output(o, out.data(), out.count(), esize);
  o.setRoot(root);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::scatter(o);
}

namespace {

void gloo_reduce(const gloo_call& gc, void* data, std::size_t count, std::size_t esize, reduce_fn fn, int root) {
  auto& o = kept<gloo::ReduceOptions>(gc, gc.context);
  set_output(o, data, count, esize);
  o.setRoot(root);
  o.setReduceFunction(fn);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::reduce(o);
}

} // namespace

void reduce_one(const gloo_call& gc, const tensor_view& t, reduce_op op, int root) {
  const int n = gc.context->size;
  if (t.count() == 0)
    return;
  const bool here = gc.context->rank == root;
  if (op == reduce_op::avg && !is_floating(t.type())) {
    std::vector<std::int64_t> wide;
    widen(t, wide);
    gloo_reduce(gc, wide.data(), wide.size(), 8, reduce_function(dtype::int64, reduce_op::sum), root);
    if (here)
      narrow_divided(wide, n, t);
    return;
  }
  gloo_reduce(gc, t.data(), t.count(), element_size(t.type()), reduce_function(t.type(), op), root);
  if (op == reduce_op::avg && here)
    divide(t, n);
}

} // namespace corodist::collective::detail
