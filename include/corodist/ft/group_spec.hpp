#pragma once
/// \file
/// corodist::ft::group_spec: the group the manager asks a process-group
/// factory (manager_options::make_group) to form when a quorum needs one.

#include <corodist/core/config.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/process_group.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace corodist::ft {

/// The group a quorum needs: this replica's rank among `size` members, to
/// be formed under `prefix` of `store`. Every member of the quorum receives
/// the same spec but for `rank` (and its own `previous`).
struct group_spec {
  /// The job's store (the manager's).
  std::shared_ptr<store::store> store;
  /// This replica's rank in the new group (its index in quorum::members).
  int rank = 0;
  /// The number of members.
  int size = 0;
  /// A key prefix in `store` that no other group uses (one per quorum).
  std::string prefix;
  /// This replica's group of the previous quorum; null when it has none (a
  /// new or restarted replica, or the previous group failed to form). It may
  /// be aborted; the manager drops it once the new group is formed.
  std::shared_ptr<collective::process_group> previous;
  /// True when `previous` is set and every new member was one of its ranks:
  /// the new members are `previous`'s ranks without `lost`, in order.
  bool subset_of_previous = false;
  /// When `subset_of_previous`: the ranks of `previous` that are not members
  /// any more, ascending (empty when the same members re-form a failed
  /// group). Empty otherwise.
  std::vector<int> lost;
  /// The manager's Gloo options (manager_options::group) with `prefix` set.
  collective::gloo_options options;
};

/// Forms the group of a spec (a coroutine on the caller's executor).
/// Throws `collective_error`/`collective_timeout_error` (or another
/// `timeout_error`) when a member is lost meanwhile: the manager then tries
/// the next quorum. Any other exception ends `manager::start_step`.
/// Cancellation: the factory's coroutine is cancelled (terminal) when the
/// awaiting `manager::start_step` is; it should then end with
/// `operation_aborted` and leave no group behind.
using group_factory =
    std::function<asio::awaitable<std::shared_ptr<collective::process_group>>(const group_spec&)>;

} // namespace corodist::ft
