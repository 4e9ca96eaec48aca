// The launcher's hang watch (node 0's launcher, which hosts the job's store):
// a rank's debug responder reports an operation waiting past --hang-after;
// the watch then gathers every rank's flight recorder through the store,
// prints the verdict (who is behind and where) and writes the dumps to a file.
// A rank that fails while the others run gets the same verdict from them.
#include "launcher.hpp"
#include "output.hpp"

#include <corodist/core/run_blocking.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/hang_verdict.hpp>
#include <corodist/store/launch_generation.hpp>
#include <corodist/store/prefix_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>

namespace corodist::tools::launch {

namespace cs = corodist::store;

namespace {

/// A watch's wait for a report is renewed after this long (below the store client's long-wait warning).
constexpr auto report_slice = std::chrono::seconds(2);
/// How long the ranks have to answer the watch.
constexpr auto gather_limit = std::chrono::seconds(5);
/// How long the survivors of a failed rank have to answer (the teardown waits for it).
constexpr auto failure_gather_limit = std::chrono::seconds(2);

std::string dump_dir(const settings& s) {
  if (!s.hang_dump_dir.empty())
    return s.hang_dump_dir;
  if (!s.log_dir.empty())
    return s.log_dir;
  if (const char* d = std::getenv("CORODIST_RECORDER_DUMP_DIR"); d != nullptr && *d != '\0')
    return d;
  return std::filesystem::temp_directory_path().string();
}

/// Prints the verdict's lines and writes its dumps as `name` under the dump directory.
void publish(const std::string& dir, const cs::hang_verdict& v, const std::string& name) {
  for (const auto& line : v.lines)
    say("  " + line);
  const auto path = std::filesystem::path(dir) / name;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << v.dumps_json();
  out.close();
  if (out)
    say("every rank's flight recorder: " + path.string());
  else
    say("cannot write the ranks' flight recorders to " + path.string());
}

asio::awaitable<void> watch_hangs(std::shared_ptr<cs::store> gen, int world, std::int64_t generation, std::string dir,
                                  std::shared_ptr<watch_state> w) {
  std::int64_t next = 1;
  std::set<std::string> judged; // the operations a verdict was given for
  for (;;) {
    std::vector<std::string> keys{cs::debug_key("stuck/" + std::to_string(next))};
    try {
      co_await gen->wait(keys, report_slice);
    } catch (const corodist::timeout_error&) {
      if (w->closing)
        co_return;
      continue;
    } catch (const std::exception&) {
      co_return; // the store is gone: the supervisor hears of it from the end watch
    }
    if (w->closing)
      co_return;
    try {
      const auto last = co_await gen->add(cs::debug_key("stuck"), 0);
      const auto report = co_await gen->get(cs::debug_key("stuck/" + std::to_string(next)));
      next = last + 1; // reports that came meanwhile are covered by this verdict
      // "rank R: allreduce #2 (...) on 'g' waiting since 3.0 s": one verdict per operation, not per rank.
      const auto colon = report.find(": ");
      const auto what = report.substr(colon == std::string::npos ? 0 : colon + 2,
                                      report.find(" waiting since") - (colon == std::string::npos ? 0 : colon + 2));
      if (!judged.insert(what).second)
        continue;
      say("hang watch: " + report + "; asking every rank for its flight recorder");
      cs::verdict_options o;
      o.gather = gather_limit;
      auto v = co_await cs::collect_hang_verdict(gen, world, o);
      say("verdict:");
      publish(dir, v, "corodist-hang-gen" + std::to_string(generation) + "-" + std::to_string(last) + ".json");
    } catch (const std::exception& e) {
      if (w->closing)
        co_return;
      say(std::string("hang watch: cannot gather a verdict: ") + e.what());
    }
  }
}

} // namespace

void launcher::start_hang_watch() {
  if (!host_ || s_.hang_after_s <= 0)
    return;
  auto gen = std::make_shared<cs::prefix_store>(cs::generation_prefix(generation_), store_);
  asio::co_spawn(loop_.get_executor(), watch_hangs(gen, assignment_.world, generation_, dump_dir(s_), watch_), asio::detached);
}

void launcher::verdict_on_failure(const rank_process& failed, const std::string& what) {
  if (!host_ || !store_)
    return;
  // Wait only for the ranks that still run: this node's that have not ended,
  // and every other node's.
  std::vector<int> running;
  for (const auto& r : ranks_)
    if (r.running && r.rank != failed.rank)
      running.push_back(r.rank);
  const int first = assignment_.rank_base, last = assignment_.rank_base + s_.nproc;
  for (int r = 0; r < assignment_.world; ++r)
    if (r < first || r >= last)
      running.push_back(r);
  if (running.empty())
    return; // no one left to say what they were doing
  try {
    auto gen = std::make_shared<cs::prefix_store>(cs::generation_prefix(generation_), store_);
    auto v = corodist::run_blocking(
        loop_.get_executor(),
        [](std::shared_ptr<cs::store> gen, int world, int rank, std::string what,
           std::vector<int> running) -> asio::awaitable<cs::hang_verdict> {
          // Only a job whose ranks run debug responders (env:// rendezvous) has anything to say.
          if ((co_await gen->list_keys(cs::debug_key("rank/"))).empty())
            co_return cs::hang_verdict{};
          auto dumps = co_await cs::gather_dumps(gen, world, failure_gather_limit, std::move(running));
          for (auto& d : dumps)
            if (d.rank == rank)
              d.problem = "it failed: " + what;
            else if (d.json.empty() && d.problem == "not waited for")
              d.problem = "it had ended";
          co_return cs::analyze_dumps(std::move(dumps));
        }(gen, assignment_.world, failed.rank, what, std::move(running)),
        "gathering the ranks' flight recorders");
    // Worth printing when another rank waits or has failed too; else the
    // failure's own line says it all.
    bool informative = v.waiting;
    const auto own = "rank " + std::to_string(failed.rank) + " ";
    for (const auto& l : v.lines)
      informative = informative || (!l.starts_with(own) && l.find(" failed ") != std::string::npos);
    if (!informative)
      return;
    say("verdict when rank " + std::to_string(failed.rank) + " failed:");
    publish(dump_dir(s_), v, "corodist-failure-gen" + std::to_string(generation_) + "-rank" + std::to_string(failed.rank) +
                       ".json");
  } catch (const std::exception& e) {
    say(std::string("cannot gather the ranks' flight recorders: ") + e.what());
  }
}

} // namespace corodist::tools::launch
