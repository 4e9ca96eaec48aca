#pragma once
/// \file
/// corodist::collective::new_group: a subgroup over a list of the parent's
/// ranks, with the semantics of PyTorch's `torch.distributed.new_group`.

#include <corodist/core/config.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/process_group.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <vector>

namespace corodist::collective {

/// Makes a group of the parent's ranks `ranks` (PyTorch's `new_group(ranks)`):
/// every rank of `parent` calls it with the same `ranks`, in the same order
/// relative to the parent's collectives. `ranks` is sorted; a member's rank in
/// the new group is its position there. Returns the new group on members,
/// null on the other ranks. Built on `parent->split` (one allgather over the
/// parent, then the backend's creation under the parent's store prefix and
/// `opts.name`, or a counted name). On a gloo_group joined to a PyTorch job's
/// default group it follows PyTorch 1.13's new_group instead (no exchange
/// over the parent; PyTorch's group numbers, keys and store-based barrier;
/// `opts.name` unused), so that PyTorch ranks calling `new_group(ranks)`
/// form the same group.
/// Throws `usage_error` for an empty `ranks`, a rank out of [0, parent size)
/// or given twice, a null parent, or a backend that cannot split (before any
/// communication); otherwise as `split`.
/// Cancellation: as `split`.
[[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<process_group> parent,
                                                                       std::vector<int> ranks,
                                                                       split_options opts);

/// As above with default options. (An overload, not a default argument: GCC
/// 12 destroys a defaulted `split_options{}` inside `co_await` twice; name a
/// rank list too rather than passing a braced one inside `co_await`.)
[[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<process_group> parent,
                                                                       std::vector<int> ranks);

/// A Gloo group of the job's ranks `ranks`, made straight from the job's
/// `store` (no parent group): this process is rank `rank` of the job's `size`.
/// A member creates a gloo_group (`gloo_group::create`) of `ranks.size()`
/// ranks, its rank the position in sorted `ranks`, under `opts.prefix` + "/"
/// + the sorted ranks ("corodist/pg/0,2,3": give groups over the same ranks
/// prefixes of their own); a non-member gets null at once (it need not call).
/// Throws `usage_error` for bad ranks (as above), a null store, `opts.pytorch`
/// set; otherwise as `gloo_group::create`.
/// Cancellation: as `gloo_group::create`.
[[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<store::store> store, int rank,
                                                                       int size, std::vector<int> ranks,
                                                                       gloo_options opts);

} // namespace corodist::collective
