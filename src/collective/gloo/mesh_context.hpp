#pragma once
// A Gloo rendezvous context that connects its full mesh as Gloo's
// connectFullMesh does -- the same store keys, so that PyTorch's ranks, which
// run that, meet ours -- in four store round trips instead of about three per
// peer, and with every pair connecting at once instead of one after another
// (each waiting for its peer process to be scheduled).

#include "collective/gloo/gloo_store.hpp"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <memory>
#include <string>
#include <vector>

namespace corodist::collective::detail {

class mesh_context final : public gloo::rendezvous::Context {
public:
  using gloo::rendezvous::Context::Context;

  /// Publishes this rank's host name ("rank_<r>") and its pairs' addresses
  /// ("<r>"), waits for every peer's, and connects every pair on threads of
  /// its own, within the context's timeout. Throws Gloo's exceptions (or
  /// timeout_error from the store) on failure.
  void connect_mesh(gloo_store& store, const std::shared_ptr<gloo::transport::Device>& dev);

  /// After connect_mesh: the address of the pair that peer `i` made for this
  /// rank (its listening end), as Gloo's address bytes.
  std::vector<char> peer_address(int i) const;

private:
  std::vector<std::string> addresses_; // rank i's "<i>" value
};

} // namespace corodist::collective::detail
