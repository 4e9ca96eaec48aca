#include <corodist/collective/round_robin_group.hpp>
#include <corodist/core/error.hpp>

#include <fmt/format.h>

namespace corodist::collective {

namespace {
const process_group& first_of(const std::vector<std::shared_ptr<process_group>>& gs) {
  if (gs.empty() || !gs.front())
    throw usage_error("round_robin_group: needs at least one group (and no null ones)");
  return *gs.front();
}
} // namespace

round_robin_group::round_robin_group(std::vector<std::shared_ptr<process_group>> groups)
    : process_group(first_of(groups).rank(), first_of(groups).size(), first_of(groups).timeout()),
      groups_(std::move(groups)) {
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    if (!groups_[i])
      throw usage_error(fmt::format("round_robin_group: group {} is null", i));
    if (groups_[i]->rank() != rank() || groups_[i]->size() != size())
      throw usage_error(fmt::format("round_robin_group: group {} is rank {} of {}, group 0 rank {} of {}", i,
                                    groups_[i]->rank(), groups_[i]->size(), rank(), size()));
  }
}

work round_robin_group::submit(collective_call call) {
  // One lock keeps "which group" and "in which order" together for callers on
  // several threads; the rotation moves only when the underlying group took
  // the call (a usage_error leaves it where it was).
  std::lock_guard lk(mutex_);
  // Sends and receives involve two ranks only: rotating on them would put the
  // other ranks' next collective on another group. They all use the first.
  if (is_point_to_point(call.kind))
    return submit_to(*groups_.front(), std::move(call));
  const auto i = next_.load(std::memory_order_relaxed);
  work w = submit_to(*groups_[i % groups_.size()], std::move(call));
  next_.store(i + 1, std::memory_order_relaxed);
  return w;
}

void round_robin_group::abort(const std::string& reason) {
  for (auto& g : groups_)
    g->abort(reason);
}

bool round_robin_group::aborted() const noexcept {
  for (const auto& g : groups_)
    if (g->aborted())
      return true;
  return false;
}

} // namespace corodist::collective
