#pragma once
// PyTorch 1.13's store-based barrier (`_store_based_barrier`), which
// init_process_group and new_group run after creating a group: every rank of
// the job, member of the new group or not, adds one to
// "store_based_barrier_key:<n>" in the job's store and polls until the job's
// world size have.

#include <corodist/core/timeout.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <string>

namespace corodist::collective::detail {

/// Runs the barrier of PyTorch group `group_index` (its key counts
/// group_index + 1, as PyTorch's `_group_count` after naming the group) over
/// `world_size` ranks in `job` (the job's store, PyTorch's `default_store`).
/// Throws `timeout_error` (its text begins with `what`) when fewer ranks
/// arrive within `limit` (a length).
/// Cancellation: terminal at its store operations and its poll timer.
asio::awaitable<void> pytorch_store_barrier(store::store& job, int group_index, int world_size,
                                            corodist::timeout limit, const std::string& what);

} // namespace corodist::collective::detail
