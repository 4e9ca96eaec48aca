// Allgather on Gloo.
#include "collective/gloo/algorithms.hpp"

#include <gloo/allgather.h>

namespace corodist::collective::detail {

void allgather(const gloo_call& gc, const tensor_view& in, const tensor_view& out) {
  if (in.count() == 0)
    return;
  auto& o = kept<gloo::AllgatherOptions>(gc, gc.context);
  const auto esize = element_size(in.type());
  set_input(o, in.data(), in.count(), esize);
  set_output(o, out.data(), out.count(), esize);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::allgather(o);
}

} // namespace corodist::collective::detail
