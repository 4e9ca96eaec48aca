// new_group: PyTorch's subgroup by rank list, on top of process_group::split
// (or, for a group joined to a PyTorch job, PyTorch's own steps).
#include <corodist/collective/new_group.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace corodist::collective {

namespace {
// `ranks` sorted, after checking each is in [0, size) and listed once.
std::vector<int> sorted_members(std::vector<int> ranks, int size) {
  if (ranks.empty())
    throw usage_error("new_group: ranks is empty (list every member; all ranks for a copy of the parent)");
  std::sort(ranks.begin(), ranks.end());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size)
      throw usage_error(fmt::format("new_group: rank {} is out of range (the job has {} ranks)", ranks[i], size));
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw usage_error(fmt::format("new_group: rank {} is listed twice", ranks[i]));
  }
  return ranks;
}
} // namespace

asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<process_group> parent,
                                                          std::vector<int> ranks, split_options opts) {
  if (!parent)
    throw usage_error("new_group: the parent group is null");
  ranks = sorted_members(std::move(ranks), parent->size());
  if (auto g = std::dynamic_pointer_cast<gloo_group>(parent); g && g->joins_pytorch())
    co_return co_await g->pytorch_new_group(std::move(ranks), std::move(opts));
  const auto me = std::find(ranks.begin(), ranks.end(), parent->rank());
  const int color = me == ranks.end() ? no_color : 0;
  const int key = static_cast<int>(me - ranks.begin());
  co_return co_await parent->split(color, key, std::move(opts));
}

asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<process_group> parent,
                                                          std::vector<int> ranks) {
  return new_group(std::move(parent), std::move(ranks), split_options{});
}

asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<store::store> store, int rank, int size,
                                                          std::vector<int> ranks, gloo_options opts) {
  if (!store)
    throw usage_error("new_group: the store is null");
  if (size < 1 || rank < 0 || rank >= size)
    throw usage_error(fmt::format("new_group: need 0 <= rank < size (rank {}, size {})", rank, size));
  if (opts.pytorch)
    throw usage_error("new_group: over a store there is no PyTorch group to follow (make the PyTorch job's default "
                      "group, then new_group(parent, ranks))");
  ranks = sorted_members(std::move(ranks), size);
  const auto me = std::find(ranks.begin(), ranks.end(), rank);
  if (me == ranks.end())
    co_return nullptr;
  opts.prefix += "/" + fmt::format("{}", fmt::join(ranks, ","));
  co_return co_await gloo_group::create(std::move(store), static_cast<int>(me - ranks.begin()),
                                        static_cast<int>(ranks.size()), std::move(opts));
}

} // namespace corodist::collective
