// corodist-run --timeline FILE (node 0's launcher, which hosts the job's
// store): while a generation runs, every --timeline-every seconds, the ranks'
// flight recorders are gathered through the store (their debug responders
// answer) and each rank's latest answer kept; when the generation ends, the
// trace-event document of them all (store::timeline_json) is written to FILE.
// A recorder goes with its object (an agent, a group, a reducer), often before
// its process exits: hence snapshots while the ranks run, not one at the end;
// what a rank did after its last snapshot is not in the file.
#include "launcher.hpp"
#include "output.hpp"

#include <corodist/store/debug_responder.hpp>
#include <corodist/store/launch_generation.hpp>
#include <corodist/store/prefix_store.hpp>
#include <corodist/store/timeline.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <fstream>
#include <map>
#include <mutex>

namespace corodist::tools::launch {

namespace cs = corodist::store;

/// The latest answer of each rank (any thread: the loop writes, the supervisor reads).
struct timeline_snapshots {
  std::mutex m;
  std::map<int, cs::rank_dump> latest;
  int world = 0;
};

namespace {

/// How long the ranks have to answer one snapshot (a rank that has ended never does).
constexpr auto snapshot_limit = std::chrono::seconds(2);

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

asio::awaitable<void> take_snapshots(std::shared_ptr<cs::store> gen, int world, std::chrono::milliseconds every,
                                     std::shared_ptr<timeline_snapshots> snaps, std::shared_ptr<watch_state> w) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  const std::string host = this_host();
  while (!w->closing) {
    timer.expires_after(every);
    (void)co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (w->closing)
      co_return;
    try {
      // Only ranks that run debug responders (env:// rendezvous) answer.
      if ((co_await gen->list_keys(cs::debug_key("rank/"))).empty())
        continue;
      auto dumps = co_await cs::gather_dumps(gen, world, snapshot_limit);
      std::lock_guard lk(snaps->m);
      for (auto& d : dumps) {
        if (d.json.empty())
          continue;
        // A rank on this host reads the same system clock: no offset to estimate.
        if (nlohmann::json::parse(d.json).value("host", std::string()) == host) {
          d.clock_offset = std::chrono::nanoseconds(0);
          d.offset_error = std::chrono::nanoseconds(0);
        }
        snaps->latest[d.rank] = std::move(d);
      }
    } catch (const std::exception& e) {
      if (w->closing)
        co_return;
      say(std::string("--timeline: cannot gather the ranks' flight recorders: ") + e.what());
    }
  }
}

} // namespace

void launcher::start_timeline() {
  if (!host_ || s_.timeline.empty())
    return;
  timeline_ = std::make_shared<timeline_snapshots>();
  timeline_->world = assignment_.world;
  auto gen = std::make_shared<cs::prefix_store>(cs::generation_prefix(generation_), store_);
  asio::co_spawn(loop_.get_executor(),
                 take_snapshots(gen, assignment_.world, to_ms(s_.timeline_every_s), timeline_, watch_),
                 asio::detached);
}

void launcher::write_timeline() {
  if (!timeline_)
    return;
  std::vector<cs::rank_dump> dumps;
  std::size_t answered = 0;
  {
    std::lock_guard lk(timeline_->m);
    for (int r = 0; r < timeline_->world; ++r) {
      auto it = timeline_->latest.find(r);
      if (it != timeline_->latest.end()) {
        dumps.push_back(it->second);
        ++answered;
      } else {
        cs::rank_dump missing;
        missing.rank = r;
        missing.problem = "never answered a snapshot (no debug responder, or it ended first)";
        dumps.push_back(std::move(missing));
      }
    }
  }
  std::ofstream out(s_.timeline, std::ios::binary | std::ios::trunc);
  out << cs::timeline_json(dumps);
  out.close();
  if (out)
    say("timeline of generation " + std::to_string(generation_) + " (" + std::to_string(answered) +
        " of " + std::to_string(timeline_->world) + " ranks): " + s_.timeline);
  else
    say("--timeline: cannot write " + s_.timeline);
}

} // namespace corodist::tools::launch
