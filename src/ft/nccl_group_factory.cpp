// ft::nccl_group_factory: a new quorum's NCCL group, shrunk from the previous
// one when members were only lost and every member can shrink, else created.
#include <corodist/ft/nccl_group_factory.hpp>

#include "core/log.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <utility>
#include <vector>

namespace corodist::ft {

namespace {

std::string ranks_text(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

// This member's view: "shrink <previous size> <lost>" when it can shrink
// (its previous group is an nccl_group that can, and its rank after the shrink
// is the one the quorum gives it), else "create".
std::string proposal(const group_spec& r, const collective::nccl_group* prev) {
  if (!r.subset_of_previous || r.lost.empty() || !prev || !prev->shrink_unavailable_reason().empty())
    return "create";
  int below = 0;
  for (auto x : r.lost)
    below += x < prev->rank() ? 1 : 0;
  if (prev->size() - static_cast<int>(r.lost.size()) != r.size || prev->rank() - below != r.rank)
    return "create";
  return fmt::format("shrink {} {}", prev->size(), ranks_text(r.lost));
}

asio::awaitable<std::shared_ptr<collective::process_group>> form(group_spec r, collective::nccl_options opts) {
  auto prev = std::dynamic_pointer_cast<collective::nccl_group>(r.previous);
  if (opts.device < 0 && prev)
    opts.device = prev->cuda_device();
  // Shrinking is collective over the remaining members and creating is a
  // rendezvous in the store: every member must take the same way.
  const auto mine = proposal(r, prev.get());
  co_await r.store->set(r.prefix + "/how/" + std::to_string(r.rank), mine);
  std::vector<std::string> keys;
  for (int i = 0; i < r.size; ++i)
    keys.push_back(r.prefix + "/how/" + std::to_string(i));
  const auto all = co_await r.store->multi_get(std::move(keys), opts.timeout);
  bool shrink = mine != "create";
  for (const auto& v : all)
    shrink = shrink && v == mine;
  opts.prefix = r.prefix + "/nccl";
  if (shrink) {
    CORODIST_LOG_DEBUG("ft: rank {} of {}: shrinking the NCCL group without ranks {}", r.rank, r.size,
                       ranks_text(r.lost));
    prev->abort("ft: the group is re-formed without the lost ranks " + ranks_text(r.lost));
    co_return co_await prev->shrink(r.lost, std::move(opts));
  }
  auto ex = r.store->get_executor();
  co_return co_await collective::nccl_group::create(std::move(ex), r.store, r.rank, r.size, std::move(opts));
}

} // namespace

group_factory nccl_group_factory(collective::nccl_options opts) {
  return [opts = std::move(opts)](const group_spec& r) { return form(r, opts); };
}

} // namespace corodist::ft
