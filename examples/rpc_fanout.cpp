// An RPC fan-out: one coordinator, many workers, one program.
//
//   corodist-run --nproc-per-node 4 rpc_fanout [ROUNDS]
//
// Rank 0 ("coordinator") sends each round's work to every other rank
// ("w1", "w2", ...) at once with rpc_async, and waits for all their answers
// before the next round; worker k's work takes about k milliseconds. Under
// `corodist-run --timeline FILE` the file shows each round: the calls on the
// coordinator, the work on each worker, an arrow from each call to its work.
#include "usage.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  constexpr const char* usage = "[ROUNDS]";
  constexpr const char* about = "An RPC fan-out (ROUNDS: 20 unless given): rank 0 calls every other rank at once, "
                                "round after round.\nRun it under corodist-run: corodist-run --nproc-per-node 4 "
                                "rpc_fanout [ROUNDS]";
  int rounds = 20;
  if (argc > 1 && examples::is_help(argv[1]))
    return examples::print_usage(argv[0], usage, about);
  if (argc > 2)
    return examples::print_usage(argv[0], usage, about, "too many arguments");
  if (argc == 2) {
    const std::string_view text = argv[1];
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rounds);
    if (ec != std::errc{} || end != text.data() + text.size() || rounds < 1) {
      const std::string error = "ROUNDS must be a positive integer, not '" + std::string(text) + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
  }
  corodist::event_loop loop;
  loop.start();
  corodist::rpc::agent_options o;
  o.init_method = "env://"; // RANK and WORLD_SIZE from corodist-run, whose launcher hosts the store
  const char* rank_text = std::getenv("RANK");
  const int rank = rank_text ? std::atoi(rank_text) : 0;
  o.name = rank == 0 ? "coordinator" : "w" + std::to_string(rank);
  corodist::rpc::agent rpc(loop, o);
  // The work: about `ms` milliseconds of it (run on the agent's worker pool), then the part's result.
  rpc.register_function("work", [rank](int round, int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return round * 100 + rank;
  });
  rpc.start(); // every worker is known from here on

  if (rank == 0) {
    const int workers = static_cast<int>(rpc.get_worker_infos().size()) - 1;
    long long total = 0;
    for (int round = 0; round < rounds; ++round) {
      std::vector<corodist::future<int>> parts;
      for (int k = 1; k <= workers; ++k)
        parts.push_back(rpc.rpc_async<int>("w" + std::to_string(k), "work", round, k));
      for (auto& p : parts)
        total += p.get();
    }
    std::printf("coordinator: %d rounds over %d workers, sum of the results %lld\n", rounds, workers, total);
  }
  rpc.shutdown(); // graceful: waits until every worker is done calling
}
