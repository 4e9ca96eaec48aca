#pragma once
/// \file
/// corodist::ft::nccl_group_factory: a process-group factory for ft::manager
/// that forms NCCL groups, by ncclCommShrink when replicas were only lost.

#include <corodist/core/config.hpp>

#include <corodist/collective/nccl_group.hpp>
#include <corodist/ft/group_spec.hpp>

namespace corodist::ft {

/// Returns a manager_options::make_group that forms nccl_groups with `opts`.
///
/// When every member of the new quorum holds the previous quorum's group as
/// an nccl_group that can shrink (nccl_group::shrink_unavailable_reason() is
/// "") and the new members are its ranks without some lost ones
/// (group_spec::subset_of_previous with `lost` not empty), the members
/// agree on that through the store (one key each under the request's
/// prefix), abort the previous group (the lost ranks may be dead: its
/// communicator is revoked, stopping what was in flight) and re-form with
/// nccl_group::shrink, without a new rendezvous. Otherwise (a replica joined, the same members re-form a failed
/// group, a member has no such group) each makes a new group with
/// nccl_group::create under the request's prefix.
///
/// `opts`: `prefix` is replaced by the request's; `timeout` bounds the
/// agreement, the creation or shrink, and is each collective's default
/// deadline (NCCL's default is 30 min: set it, e.g. to
/// manager_options::default_group_timeout); `device` is this replica's GPU
/// (-1: the previous group's device, else `rank % device count` of the new
/// group: set it when the replica's buffers live on a given GPU).
/// Errors: those of nccl_group::create and nccl_group::shrink, and the store's
/// `timeout_error` when a member does not take part in the agreement.
group_factory nccl_group_factory(collective::nccl_options opts);

} // namespace corodist::ft
