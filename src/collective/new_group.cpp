// new_group: PyTorch's subgroup by rank list, on top of process_group::split
// (or, for a group joined to a PyTorch job, PyTorch's own steps).
#include <corodist/collective/new_group.hpp>

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace corodist::collective {

asio::awaitable<std::shared_ptr<process_group>> new_group(std::shared_ptr<process_group> parent,
                                                          std::vector<int> ranks, split_options opts) {
  if (!parent)
    throw usage_error("new_group: the parent group is null");
  if (ranks.empty())
    throw usage_error("new_group: ranks is empty (list every member; all ranks for a copy of the parent)");
  std::sort(ranks.begin(), ranks.end());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= parent->size())
      throw usage_error(fmt::format("new_group: rank {} is out of range (the parent has {} ranks)", ranks[i],
                                    parent->size()));
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw usage_error(fmt::format("new_group: rank {} is listed twice", ranks[i]));
  }
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

} // namespace corodist::collective
