#include "launcher.hpp"
#include "output.hpp"
#include "signals.hpp"

#include <corodist/store/launch_generation.hpp>

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>

namespace corodist::tools::launch {

namespace cs = corodist::store;

std::string round_key(std::int64_t generation) { return "corodist/run/round/" + std::to_string(generation) + "/"; }

// The first word of `s` and the rest after one space.
std::pair<std::string, std::string> split_word(const std::string& s) {
  auto sp = s.find(' ');
  if (sp == std::string::npos)
    return {s, ""};
  return {s.substr(0, sp), s.substr(sp + 1)};
}

int to_int(const std::string& s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    throw launch_error("corodist-run: unexpected value '" + s + "' in the job's store");
  return v;
}

// Joins the round of generation_ (and of later ones when this node came
// after a round had closed); false when the job ended meanwhile.
bool launcher::join_round() {
  if (generation_ == 0 && sync_->check({corodist::store::generation_key}))
    generation_ = to_int(sync_->get(corodist::store::generation_key)); // a node that comes late
  for (;;) {
    const auto base = round_key(generation_);
    const auto slot = sync_->add(base + "joined", 1);
    sync_->set(base + "node/" + std::to_string(slot), std::to_string(s_.nproc) + " " +
                                                         std::to_string(s_.elastic ? -1 : s_.node_rank) + " " +
                                                         (host_ ? "1" : "0"));
    if (slot == s_.min_nodes)
      sync_->set(base + "min", "1");
    if (slot == s_.max_nodes)
      sync_->set(base + "max", "1");
    if (host_)
      close_round(base);
    const auto closed = must_wait_key(base + "closed", "the rendezvous of generation " + std::to_string(generation_) +
                                                           " to close (the launcher of node 0 at " + store_address() +
                                                           " closes it once " + std::to_string(s_.min_nodes) +
                                                           " nodes are in)");
    auto [word, rest] = split_word(closed);
    if (word == "done")
      return false;
    if (word == "error")
      throw launch_error(rest);
    // "ok RESTARTS WORLD NODES" then a line "SLOT NODE_RANK RANK_BASE NPROC" per node
    std::istringstream in(rest);
    assignment a;
    in >> a.restart_count >> a.world >> a.nodes;
    for (int i = 0; i < a.nodes; ++i) {
      std::int64_t sl = 0;
      int node = 0, base_rank = 0, nproc = 0;
      in >> sl >> node >> base_rank >> nproc;
      if (sl == slot) {
        a.node_rank = node;
        a.rank_base = base_rank;
        assignment_ = a;
        return true;
      }
    }
    if (a.nodes < s_.max_nodes) {
      // Room for this node: the running generation ends, and every node
      // meets again with it (a change of membership, not a restart: as
      // torchrun's waiting nodes).
      say("this node came after the rendezvous of generation " + std::to_string(generation_) + " closed with " +
          std::to_string(a.nodes) + " of at most " + std::to_string(s_.max_nodes) +
          " nodes: the running workers are stopped to admit it");
      (void)sync_->compare_set(round_key(generation_) + "end", "",
                               "admit a node is waiting to join the job (" + std::to_string(a.nodes) +
                                   " of at most " + std::to_string(s_.max_nodes) + " nodes)");
    } else {
      say("this node came after the rendezvous of generation " + std::to_string(generation_) + " closed with " +
          std::to_string(a.nodes) + " nodes, the most --nnodes allows: it waits for the next generation");
    }
    ++generation_;
  }
}

// Node 0: waits for MIN nodes, then at most the join window for MAX, and
// assigns node ranks and rank ranges.
void launcher::close_round(const std::string& base) {
  (void)must_wait_key(base + "min", std::to_string(s_.min_nodes) + " nodes to join generation " +
                                        std::to_string(generation_));
  if (s_.max_nodes > s_.min_nodes)
    (void)wait_key(base + "max", std::max(std::chrono::milliseconds(1), to_ms(s_.join_window_s)));
  const auto joined = sync_->add(base + "joined", 0);
  std::vector<std::string> keys;
  for (std::int64_t k = 1; k <= joined; ++k)
    keys.push_back(base + "node/" + std::to_string(k));
  const auto values = sync_->multi_get(keys);
  struct node {
    std::int64_t slot;
    int nproc, given, host;
    int rank = 0;
  };
  std::vector<node> nodes;
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::istringstream in(values[i]);
    node n{static_cast<std::int64_t>(i) + 1, 0, 0, 0};
    in >> n.nproc >> n.given >> n.host;
    nodes.push_back(n);
  }
  // node 0 first, then the others in the order they came; at most MAX
  std::stable_partition(nodes.begin(), nodes.end(), [](const node& n) { return n.host == 1; });
  if (nodes.size() > static_cast<std::size_t>(s_.max_nodes))
    nodes.resize(static_cast<std::size_t>(s_.max_nodes));
  std::string error;
  if (s_.elastic) {
    for (std::size_t i = 0; i < nodes.size(); ++i)
      nodes[i].rank = static_cast<int>(i);
  } else {
    std::set<int> seen;
    for (auto& n : nodes) {
      n.rank = n.given;
      if (n.given < 0 || n.given >= s_.max_nodes)
        error = "a launcher joined with --nnodes MIN:MAX where this job has --nnodes " + std::to_string(s_.max_nodes);
      else if (!seen.insert(n.given).second)
        error = "two launchers were started with --node-rank " + std::to_string(n.given);
    }
    std::sort(nodes.begin(), nodes.end(), [](const node& a, const node& b) { return a.rank < b.rank; });
  }
  if (!error.empty()) {
    sync_->set(base + "closed", "error " + error);
    return;
  }
  int world = 0;
  std::string lines;
  for (auto& n : nodes) {
    lines += "\n" + std::to_string(n.slot) + " " + std::to_string(n.rank) + " " + std::to_string(world) + " " +
             std::to_string(n.nproc);
    world += n.nproc;
  }
  sync_->set(corodist::store::generation_key, std::to_string(generation_));
  sync_->set(base + "closed", "ok " + std::to_string(restart_count_) + " " + std::to_string(world) + " " +
                                  std::to_string(nodes.size()) + lines);
}
} // namespace corodist::tools::launch
