// Barrier on Gloo.
#include "collective/gloo/algorithms.hpp"

#include <gloo/barrier.h>

namespace corodist::collective::detail {

void barrier(const gloo_call& gc) {
  auto& o = kept<gloo::BarrierOptions>(gc, gc.context);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::barrier(o);
}

} // namespace corodist::collective::detail
