// Allgather on Gloo: even (allgather) and with a count per rank (allgatherv).
#include "collective/gloo/algorithms.hpp"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>

#include <cstddef>
#include <vector>

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

void allgatherv(const gloo_call& gc, const tensor_view& in, const tensor_view& out,
                const std::vector<std::size_t>& counts) {
  if (out.count() == 0)
    return;
  auto& o = kept<gloo::AllgathervOptions>(gc, gc.context);
  const auto esize = element_size(in.type());
  // (Gloo's typed setters take T*; the untyped ones are private: one
  // unsigned type per element size, as set_input does.)
  switch (esize) {
  case 1:
    o.setInput(static_cast<std::uint8_t*>(in.data()), in.count());
    o.setOutput(static_cast<std::uint8_t*>(out.data()), counts);
    break;
  case 2:
    o.setInput(static_cast<std::uint16_t*>(in.data()), in.count());
    o.setOutput(static_cast<std::uint16_t*>(out.data()), counts);
    break;
  case 4:
    o.setInput(static_cast<std::uint32_t*>(in.data()), in.count());
    o.setOutput(static_cast<std::uint32_t*>(out.data()), counts);
    break;
  default:
    o.setInput(static_cast<std::uint64_t*>(in.data()), in.count());
    o.setOutput(static_cast<std::uint64_t*>(out.data()), counts);
    break;
  }
  o.setTag(gc.tag);
  o.setTimeout(time_left(gc));
  gloo::allgatherv(o);
}

} // namespace corodist::collective::detail
