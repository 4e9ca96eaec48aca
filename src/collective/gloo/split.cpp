// gloo_group's subgroups: split (an allgather of colors, then a gloo_group
// per color under the parent's prefix) and PyTorch's new_group over a job's
// default group (PyTorch's group numbers, keys and store-based barrier).
#include "collective/gloo/gloo_group_impl.hpp"

#include <corodist/core/error.hpp>
#include <corodist/store/prefix_store.hpp>

#include "collective/gloo/pytorch_barrier.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace corodist::collective {

bool gloo_group::joins_pytorch() const noexcept { return impl_->opts.pytorch.has_value(); }

asio::awaitable<std::shared_ptr<process_group>> gloo_group::split(int color, int key, split_options opts) {
  if (color < 0 && color != no_color)
    throw usage_error(fmt::format("gloo_group::split: color {} is negative (colors are >= 0, or no_color)", color));
  if (impl_->opts.pytorch)
    throw usage_error("gloo_group::split: a group joined to a PyTorch job cannot split (PyTorch has no split; "
                      "use collective::new_group, which follows PyTorch's new_group)");
  const auto limit = group_timeout(opts.timeout, timeout(), "gloo_group::split");
  const int n = splits_.fetch_add(1, std::memory_order_relaxed);
  auto keep = shared_from_this(); // the parent outlives the exchange whatever the caller drops
  const auto colors = co_await exchange_colors(color, key, limit);
  if (color == no_color)
    co_return nullptr;
  std::vector<std::pair<int, int>> members; // (key, rank in this group)
  for (int r = 0; r < size(); ++r)
    if (colors[static_cast<std::size_t>(r)].first == color)
      members.emplace_back(colors[static_cast<std::size_t>(r)].second, r);
  std::sort(members.begin(), members.end());
  const auto me = std::find(members.begin(), members.end(), std::pair<int, int>(key, rank()));
  const int new_rank = static_cast<int>(me - members.begin());
  gloo_options o = impl_->opts;
  o.prefix = fmt::format("{}/{}/{}", impl_->opts.prefix, opts.name.empty() ? fmt::format("split{}", n) : opts.name,
                         color);
  o.timeout = limit;
  auto g = co_await create(impl_->store, new_rank, static_cast<int>(members.size()), o);
  co_return g;
}

asio::awaitable<std::shared_ptr<gloo_group>> gloo_group::pytorch_new_group(std::vector<int> ranks,
                                                                           split_options opts) {
  if (!impl_->opts.pytorch || impl_->opts.pytorch->group_index != 0)
    throw usage_error("gloo_group::pytorch_new_group: the group must have joined a PyTorch job's default group "
                      "(gloo_options::pytorch with group_index 0)");
  const auto limit = group_timeout(opts.timeout, timeout(), "new_group");
  const int index = pytorch_groups_.fetch_add(1, std::memory_order_relaxed) + 1;
  auto keep = shared_from_this();
  const auto& py = *impl_->opts.pytorch;
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  if (me == ranks.end()) {
    // PyTorch's non-members take the group number and run the barrier only.
    std::shared_ptr<store::store> job =
        py.store_prefix.empty() ? impl_->store : std::make_shared<store::prefix_store>(py.store_prefix, impl_->store);
    const auto what = fmt::format("new_group (PyTorch group {}, rank {} of the job, not a member)", index, rank());
    co_await detail::pytorch_store_barrier(*job, index, size(), limit, what);
    co_return nullptr;
  }
  gloo_options o = impl_->opts;
  o.pytorch->group_index = index;
  o.pytorch->world_size = size();
  o.timeout = limit;
  co_return co_await create(impl_->store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), o);
}

} // namespace corodist::collective
