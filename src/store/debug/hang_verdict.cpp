#include <corodist/store/hang_verdict.hpp>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

namespace corodist::store {

namespace {

using nlohmann::json;

/// One recorded operation as the verdict reads it.
struct op_view {
  std::string layer, name, op, detail, peer, where, state, error;
  std::uint64_t seq = 0;
  double age_s = 0;    ///< waiting: since it started; ended: since it ended
};

/// What one rank's answer says.
struct rank_view {
  int rank = -1;
  bool answered = false;
  std::string problem;
  std::vector<op_view> pending;                       ///< queued or started, oldest first
  std::map<std::string, std::uint64_t> started_seq;   ///< collective recorder -> highest number started
  std::map<std::string, std::uint64_t> completed_seq; ///< collective recorder -> highest number ended
  std::set<std::string> recorders;                    ///< names of its collective recorders (groups)
  std::optional<op_view> last;                        ///< the operation that ended last
  double last_end_ns = -1;
};

/// Point-to-point operations have numbers of their own, not the group's collective numbers.
bool numbered(const op_view& o) {
  return o.layer == "collective" && o.op != "send" && o.op != "recv" && o.op != "batch_isend_irecv";
}

std::string describe(const op_view& o) {
  if (o.layer == "collective") {
    std::string s = fmt::format("{} #{}", o.op, o.seq);
    if (!o.detail.empty())
      s += " (" + o.detail + ")";
    if (!numbered(o) && !o.peer.empty())
      s += " with " + o.peer;
    s += " on group '" + o.name + "'";
    if (!o.where.empty())
      s += " at " + o.where;
    return s;
  }
  if (o.layer == "rpc" && o.op == "call")
    return fmt::format("call '{}' to '{}'", o.detail, o.peer);
  if (o.layer == "rpc" && o.op == "serve")
    return fmt::format("serving '{}' for '{}'", o.detail, o.peer);
  if (o.layer == "store")
    return fmt::format("store {} '{}'", o.op, o.detail);
  return fmt::format("{} {} {} of '{}'", o.layer, o.op, o.detail, o.name);
}

std::string seconds(double s) { return fmt::format("{:.1f} s", s); }

/// "rank 2", "ranks 0,1", "ranks 0-3".
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1)
    return "rank " + std::to_string(ranks[0]);
  std::string s = "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (i > 0)
      s += ",";
    s += j >= i + 2 ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    if (j == i + 1)
      s += "," + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

rank_view read_rank(const rank_dump& d) {
  rank_view v;
  v.rank = d.rank;
  v.problem = d.problem;
  if (d.json.empty())
    return v;
  json doc;
  try {
    doc = json::parse(d.json);
  } catch (const std::exception& e) {
    v.problem = std::string("its answer does not parse: ") + e.what();
    return v;
  }
  v.answered = true;
  const double now_ns = doc.value("steady_ns", 0.0);
  for (const auto& r : doc.value("recorders", json::array())) {
    const std::string layer = r.value("layer", "");
    const std::string name = r.value("name", "");
    if (layer == "collective")
      v.recorders.insert(name);
    for (const auto& e : r.value("entries", json::array())) {
      op_view o{layer,
                name,
                e.value("op", ""),
                e.value("detail", ""),
                e.value("peer", ""),
                e.value("where", ""),
                e.value("state", ""),
                e.value("error", ""),
                e.value("seq", std::uint64_t{0}),
                e.value("age_ms", 0.0) / 1000.0};
      const bool waiting = o.state == "started" || o.state == "queued";
      if (numbered(o)) {
        if (o.state != "queued")
          v.started_seq[name] = std::max(v.started_seq[name], o.seq);
        if (!waiting)
          v.completed_seq[name] = std::max(v.completed_seq[name], o.seq);
      }
      if (layer == "store" && o.detail.find("debug/") != std::string::npos)
        continue; // the debug responder's own requests
      if (waiting) {
        v.pending.push_back(std::move(o));
      } else if (const double end = e.value("ended_ns", 0.0); end > v.last_end_ns) {
        v.last_end_ns = end;
        o.age_s = (now_ns - end) / 1e9;
        v.last = std::move(o);
      }
    }
  }
  return v;
}

/// The ranks of `views` that take part in recorder `name` (have it), and the
/// ranks that did not answer (they may).
std::vector<int> members(const std::vector<rank_view>& views, const std::string& name) {
  std::vector<int> out;
  for (const auto& v : views)
    if (!v.answered || v.recorders.contains(name))
      out.push_back(v.rank);
  return out;
}

bool behind(const rank_view& v, const std::string& name, std::uint64_t seq) {
  if (!v.answered)
    return false;
  auto it = v.started_seq.find(name);
  return it == v.started_seq.end() || it->second < seq;
}

std::vector<int> behind_in(const std::vector<rank_view>& views, const op_view& o) {
  std::vector<int> out;
  for (int r : members(views, o.name))
    if (behind(views[r], o.name, o.seq))
      out.push_back(r);
  return out;
}

} // namespace

std::string hang_verdict::text() const {
  std::string s;
  for (const auto& l : lines)
    s += l + "\n";
  return s;
}

std::string hang_verdict::dumps_json() const {
  json ranks = json::array();
  for (const auto& d : dumps) {
    json dump = nullptr;
    if (!d.json.empty()) {
      try {
        dump = json::parse(d.json);
      } catch (const std::exception&) {
        dump = d.json;
      }
    }
    ranks.push_back({{"rank", d.rank},
                     {"problem", d.problem},
                     {"clock_offset_ns", d.clock_offset.count()},
                     {"clock_offset_error_ns", d.offset_error.count()},
                     {"dump", std::move(dump)}});
  }
  return json{{"verdict", lines}, {"ranks", std::move(ranks)}}.dump(1, ' ', false, json::error_handler_t::replace);
}

std::vector<int> ranks_behind(const std::vector<rank_dump>& dumps, std::string_view layer, std::string_view name,
                              std::uint64_t seq) {
  std::vector<int> out;
  for (const auto& d : dumps) {
    const auto v = read_rank(d);
    if (!v.answered)
      continue;
    (void)layer; // only collective recorders carry group numbers
    if (v.recorders.contains(std::string(name)) && behind(v, std::string(name), seq))
      out.push_back(d.rank);
  }
  return out;
}

hang_verdict analyze_dumps(std::vector<rank_dump> dumps) {
  std::sort(dumps.begin(), dumps.end(), [](const rank_dump& a, const rank_dump& b) { return a.rank < b.rank; });
  std::vector<rank_view> views;
  for (const auto& d : dumps)
    views.push_back(read_rank(d));
  // Index by rank (dumps are 0..n-1 from gather_dumps; be safe with others).
  std::vector<rank_view> by_rank;
  for (auto& v : views) {
    if (v.rank < 0)
      continue;
    if (static_cast<std::size_t>(v.rank) >= by_rank.size())
      by_rank.resize(v.rank + 1);
    by_rank[v.rank] = v;
  }
  for (std::size_t r = 0; r < by_rank.size(); ++r)
    if (by_rank[r].rank < 0) {
      by_rank[r].rank = static_cast<int>(r);
      by_rank[r].problem = "not asked";
    }

  hang_verdict out;
  std::set<int> described;
  // 1. Collectives waited in, rank groups per (group, number, call).
  struct wait_group {
    op_view op;
    std::vector<int> ranks;
    double since = 0;
  };
  std::map<std::tuple<std::string, std::uint64_t, std::string, std::string>, wait_group> waits;
  std::map<int, std::vector<int>> waits_for; // rank -> the ranks it waits for
  for (const auto& v : by_rank)
    for (const auto& o : v.pending)
      if (numbered(o)) {
        auto& g = waits[{o.name, o.seq, o.op, o.detail}];
        if (g.ranks.empty())
          g.op = o;
        g.ranks.push_back(v.rank);
        g.since = std::max(g.since, o.age_s);
        out.waiting = true;
        break; // a rank waits in its oldest collective
      }
  std::vector<int> behind_ranks;
  for (auto& [key, g] : waits) {
    auto late = behind_in(by_rank, g.op);
    std::string line = fmt::format("{} wait{} in {} since {}", ranks_text(g.ranks), g.ranks.size() == 1 ? "s" : "",
                                   describe(g.op), seconds(g.since));
    std::vector<int> silent;
    for (int r : members(by_rank, g.op.name))
      if (!by_rank[r].answered && std::find(g.ranks.begin(), g.ranks.end(), r) == g.ranks.end())
        silent.push_back(r);
    if (!late.empty())
      line += "; not arrived: " + ranks_text(late);
    if (!silent.empty())
      line += "; no answer from " + ranks_text(silent);
    out.lines.push_back(std::move(line));
    for (int r : g.ranks) {
      described.insert(r);
      auto& w = waits_for[r];
      w.insert(w.end(), late.begin(), late.end());
    }
    for (int r : late) {
      const auto& v = by_rank[r];
      auto done = v.completed_seq.find(g.op.name);
      std::string l = "rank " + std::to_string(r) + " " +
                      (done == v.completed_seq.end() ? "has made no collective"
                                                     : fmt::format("completed #{}", done->second)) +
                      " of group '" + g.op.name + "'";
      const op_view* elsewhere = nullptr;
      for (const auto& o : v.pending)
        if (!elsewhere || numbered(o))
          elsewhere = &o;
      if (elsewhere)
        l += " and waits in " + describe(*elsewhere) + " since " + seconds(elsewhere->age_s);
      else if (v.last)
        l += " and is in no collective (last: " + describe(*v.last) + ", ended " + seconds(v.last->age_s) + " ago)";
      else
        l += " and is in no collective";
      if (!described.contains(r) && std::find(behind_ranks.begin(), behind_ranks.end(), r) == behind_ranks.end()) {
        behind_ranks.push_back(r);
        out.lines.push_back(std::move(l));
      }
    }
  }
  for (int r : behind_ranks)
    described.insert(r);
  // 2. A cycle of ranks each waiting for the next: a deadlock across groups.
  for (const auto& waiting_rank : waits_for) {
    const int start = waiting_rank.first; // (a plain variable: clang 14 cannot capture a structured binding)
    std::vector<int> path{start};
    std::set<int> seen{start};
    bool found = false;
    std::function<bool(int)> dfs = [&](int r) -> bool {
      auto it = waits_for.find(r);
      if (it == waits_for.end())
        return false;
      for (int s : it->second) {
        if (s == start && path.size() > 1)
          return true;
        if (seen.insert(s).second) {
          path.push_back(s);
          if (dfs(s))
            return true;
          path.pop_back();
        }
      }
      return false;
    };
    found = dfs(start);
    if (found) {
      std::string l = "deadlock:";
      for (std::size_t i = 0; i < path.size(); ++i) {
        const int r = path[i];
        const int next = path[(i + 1) % path.size()];
        const op_view* o = nullptr;
        for (const auto& p : by_rank[r].pending)
          if (numbered(p)) {
            o = &p;
            break;
          }
        l += fmt::format("{} rank {} waits in {} for rank {}", i ? ";" : "", r, o ? describe(*o) : "?", next);
      }
      l += " (each waits for a rank that waits in another group)";
      out.lines.push_back(std::move(l));
      break;
    }
  }
  // 3. Other ranks waiting in calls, and ranks that did not answer.
  for (const auto& v : by_rank) {
    if (described.contains(v.rank))
      continue;
    if (!v.answered) {
      out.lines.push_back("rank " + std::to_string(v.rank) + " did not answer: " + v.problem);
      continue;
    }
    bool said = false;
    for (const auto& o : v.pending)
      if (o.layer == "rpc" && o.op == "call") {
        out.waiting = true;
        said = true;
        out.lines.push_back(fmt::format("rank {} waits in {} since {}", v.rank, describe(o), seconds(o.age_s)));
        break;
      }
    if (!said && v.last && v.last->state == "failed")
      out.lines.push_back(fmt::format("rank {}: {} failed {} ago: {}", v.rank, describe(*v.last),
                                      seconds(v.last->age_s), v.last->error));
    if (!v.problem.empty())
      out.lines.push_back("rank " + std::to_string(v.rank) + ": " + v.problem);
  }
  if (!out.waiting)
    out.lines.insert(out.lines.begin(), "no rank waits in a collective or an RPC call");
  out.dumps = std::move(dumps);
  return out;
}

asio::awaitable<hang_verdict> collect_hang_verdict(std::shared_ptr<store> job_store, int world_size,
                                                   verdict_options opts) {
  auto dumps = co_await gather_dumps(std::move(job_store), world_size, opts.gather);
  co_return analyze_dumps(std::move(dumps));
}

} // namespace corodist::store
