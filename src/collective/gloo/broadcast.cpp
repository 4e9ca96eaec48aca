// Broadcast on Gloo.
#include "collective/gloo/algorithms.hpp"

#include <gloo/broadcast.h>

namespace corodist::collective::detail {

void broadcast_one(const gloo_call& gc, const tensor_view& t, int root) {
  if (t.count() == 0)
    return;
  auto& o = kept<gloo::BroadcastOptions>(gc, gc.context);
  set_output(o, t.data(), t.count(), element_size(t.type()));
  o.setRoot(root);
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::broadcast(o);
}

} // namespace corodist::collective::detail
