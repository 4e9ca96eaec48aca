#pragma once
/// \file
/// corodist::rref::info: what one worker's RRef protocol holds (debug_info).

#include <corodist/core/config.hpp>

#include <corodist/rpc/agent.hpp>

#include <cstddef>

namespace corodist::rref {

/// What one worker's protocol holds (PyTorch's _rref_context_get_debug_info).
struct debug_info {
  std::size_t owners = 0;           ///< OwnerRRefs (values held here)
  std::size_t users = 0;            ///< UserRRefs here that the owner knows
  std::size_t pending_users = 0;    ///< UserRRefs here the owner has not confirmed yet
  std::size_t pending_children = 0; ///< forks made here whose receiver has not been confirmed (G2 holds)
  std::size_t forks = 0;            ///< UserRRefs elsewhere known to this worker's owners
  std::size_t unacked = 0;          ///< control messages sent and not yet acknowledged
};

/// What `a`'s protocol holds now (any thread; waits for the loop).
debug_info info(rpc::agent& a);

} // namespace corodist::rref
