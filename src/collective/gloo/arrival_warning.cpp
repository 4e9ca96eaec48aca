// The warning of a collective that waits long, naming the ranks not arrived.
#include "collective/gloo/arrival_warning.hpp"

#include "collective/describe.hpp"
#include "collective/gloo/gloo_group_impl.hpp"

#include <corodist/store/debug_responder.hpp>
#include <corodist/store/hang_verdict.hpp>

#include "core/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace corodist::collective::detail {

namespace {

std::string head(const waiting_collective& w) {
  return fmt::format("rank {}: {} on group '{}' has waited {:.1f} s", w.rank, w.call, w.group,
                     std::chrono::duration<double>(w.waited).count());
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

asio::awaitable<void> gather_and_warn(std::shared_ptr<store::debug_responder> resp, waiting_collective w,
                                      std::shared_ptr<std::atomic<bool>> asking) {
  try {
    const auto dumps = co_await store::gather_dumps(resp->job_store(), 0, corodist::timeout(gather_limit));
    const auto behind = store::ranks_behind(dumps, "collective", w.group, w.seq);
    std::vector<int> silent;
    for (const auto& d : dumps)
      if (d.json.empty())
        silent.push_back(d.rank);
    std::string text = head(w) + "; not arrived: " + (behind.empty() ? std::string("none named") : ranks_text(behind));
    if (!silent.empty())
      text += fmt::format(" ({} did not answer within {} s)", ranks_text(silent), gather_limit.count());
    CORODIST_LOG_WARN("{}", text);
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("{}; the ranks not arrived could not be gathered: {}", head(w), e.what());
  }
  asking->store(false, std::memory_order_release);
}

} // namespace

void warn_waiting(waiting_collective w, const std::shared_ptr<std::atomic<bool>>& asking) {
  auto resp = store::debug_responder::current();
  if (!resp) {
    CORODIST_LOG_WARN("{} (no debug responder in this process: the ranks are named by corodist-run's verdict)",
                      head(w));
    return;
  }
  if (asking->exchange(true, std::memory_order_acq_rel)) {
    CORODIST_LOG_WARN("{} (the ranks are being gathered for an earlier warning)", head(w));
    return;
  }
  auto text = head(w);
  try {
    auto ex = resp->job_store()->get_executor();
    asio::co_spawn(ex, gather_and_warn(std::move(resp), std::move(w), asking), asio::detached);
  } catch (const std::exception& e) {
    asking->store(false, std::memory_order_release);
    CORODIST_LOG_WARN("{}; the ranks not arrived could not be gathered: {}", text, e.what());
  }
}

} // namespace corodist::collective::detail

namespace corodist::collective {

// ---- the group's side -------------------------------------------------------------

void gloo_group::impl::warn_stalled(clock::time_point now) {
  for (auto& [seq, op] : inflight) {
    const auto started = op->started.load(std::memory_order_acquire);
    if (started == 0 || op->state->completed())
      continue;
    const auto ran = now - clock::time_point(clock::duration(started));
    if (ran < op->warn_after)
      return; // the oldest running collective has not waited long enough
    op->warn_after = 2 * ran;
    fmt::memory_buffer args;
    detail::describe_args_to(args, op->call);
    detail::waiting_collective w;
    w.call = args.size() == 0 ? fmt::format("{} #{}", to_string(op->call.kind), seq)
                              : fmt::format("{} #{} ({})", to_string(op->call.kind), seq, fmt::to_string(args));
    w.group = recorder_name(opts);
    w.rank = rank;
    w.seq = seq;
    w.waited = ran;
    detail::warn_waiting(std::move(w), warning_gather);
    return;
  }
}

} // namespace corodist::collective
