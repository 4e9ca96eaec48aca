// timeline_json: the ranks' flight-recorder dumps as one trace-event document.
#include <corodist/store/timeline.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>

namespace corodist::store {

namespace {

using nlohmann::json;

// One entry, its times on the collector's clock (ns since the Unix epoch).
struct span {
  int pid = 0;
  int tid = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool instant = false;
  const json* entry = nullptr;
};

std::int64_t ns_since_epoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::string flow_id(std::uint64_t flow) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(flow));
  return buf;
}

double micros(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

/// The entries of one recorder that overlap [from, to], as spans of rank
/// `pid` (tid 0: the recorder's first lane), its steady times moved by `shift`
/// onto the collector's clock; one still running lasts until `dumped` (steady).
void read_entries(const json& entries, int pid, std::int64_t shift, std::int64_t dumped, std::int64_t from,
                  std::int64_t to, std::vector<span>& out) {
  for (const json& e : entries) {
    if (!e.is_object())
      continue;
    const std::int64_t started = e.value("started_ns", std::int64_t{0});
    const std::int64_t queued = e.value("queued_ns", std::int64_t{0});
    const std::int64_t ended = e.value("ended_ns", std::int64_t{0});
    const std::int64_t b = (started != 0 ? started : queued) + shift;
    const std::int64_t en = std::max(b, (ended != 0 ? ended : dumped) + shift);
    if (b > to || en < from)
      continue;
    out.push_back(span{pid, 0, b, en, e.value("op", std::string()) == "mark" || en == b, &e});
  }
}

/// Gives each span a lane (its tid, from 0) such that no two spans of a lane
/// overlap (instants on lane 0); returns the number of lanes (at least 1).
int assign_lanes(std::vector<span>& spans) {
  std::vector<span*> order;
  for (auto& s : spans)
    if (!s.instant)
      order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const span* a, const span* b) { return a->begin < b->begin; });
  std::vector<std::int64_t> lane_end;
  for (span* s : order) {
    std::size_t l = 0;
    while (l < lane_end.size() && lane_end[l] > s->begin)
      ++l;
    if (l == lane_end.size())
      lane_end.push_back(s->end);
    else
      lane_end[l] = s->end;
    s->tid = static_cast<int>(l);
  }
  return std::max<int>(1, static_cast<int>(lane_end.size()));
}

std::string event_name(const json& e) {
  std::string op = e.value("op", std::string());
  const std::string detail = e.value("detail", std::string());
  if (detail.empty() || detail.starts_with(op))
    return detail.empty() ? op : detail;
  return op + " " + detail;
}

} // namespace

std::string timeline_json(const std::vector<rank_dump>& dumps, timeline_window window) {
  const std::int64_t from = window.from == std::chrono::system_clock::time_point::min()
                                ? std::numeric_limits<std::int64_t>::min()
                                : ns_since_epoch(window.from);
  const std::int64_t to = window.to == std::chrono::system_clock::time_point::max()
                              ? std::numeric_limits<std::int64_t>::max()
                              : ns_since_epoch(window.to);

  std::vector<json> docs(dumps.size()); // parsed dumps (the spans point into them)
  std::vector<span> spans;
  json meta = json::array();
  json ranks = json::array();
  for (std::size_t d = 0; d < dumps.size(); ++d) {
    const rank_dump& rd = dumps[d];
    json info{{"rank", rd.rank},
              {"clock_offset_ns", rd.clock_offset.count()},
              {"offset_error_ns", rd.offset_error.count()}};
    if (!rd.problem.empty())
      info["problem"] = rd.problem;
    if (rd.json.empty()) {
      ranks.push_back(std::move(info));
      continue;
    }
    json& doc = docs[d];
    try {
      doc = json::parse(rd.json);
      if (!doc.is_object() || !doc.contains("recorders") || !doc["recorders"].is_array())
        throw std::runtime_error("no \"recorders\" list");
      const std::int64_t unix_ns = doc.at("unix_ns").get<std::int64_t>();
      const std::int64_t steady_ns = doc.at("steady_ns").get<std::int64_t>();
      // A steady time of this rank, on the collector's system clock.
      const std::int64_t shift = unix_ns - steady_ns - rd.clock_offset.count();
      info["pid"] = doc.value("pid", 0);
      info["host"] = doc.value("host", std::string());
      info["dumped_unix_ns"] = unix_ns - rd.clock_offset.count();
      const int pid = rd.rank;
      std::vector<json> my_meta;
      my_meta.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(rd.rank)}}}});
      my_meta.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0},
                      {"args", {{"sort_index", rd.rank}}}});
      std::vector<span> mine; // added once the whole dump has been read
      int next_tid = 1;
      for (const json& r : doc["recorders"]) {
        const std::string track = r.value("layer", std::string()) + " " + r.value("name", std::string());
        std::vector<span> rec; // this recorder's
        if (r.contains("entries") && r["entries"].is_array())
          read_entries(r["entries"], pid, shift, steady_ns, from, to, rec);
        // Spans of one thread must nest: those that overlap (two calls in flight,
        // two buckets) go on lanes of their own, "<track> (2)", ...
        const int lanes = assign_lanes(rec);
        for (int l = 0; l < lanes; ++l) {
          const int tid = next_tid + l;
          my_meta.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid},
                             {"args", {{"name", l == 0 ? track : track + " (" + std::to_string(l + 1) + ")"}}}});
          my_meta.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid},
                             {"args", {{"sort_index", tid}}}});
        }
        for (auto& s : rec)
          s.tid += next_tid;
        next_tid += lanes;
        mine.insert(mine.end(), rec.begin(), rec.end());
      }
      spans.insert(spans.end(), mine.begin(), mine.end());
      for (auto& m : my_meta)
        meta.push_back(std::move(m));
    } catch (const std::exception& ex) {
      info["problem"] = (rd.problem.empty() ? "" : rd.problem + "; ") + "its dump does not parse: " + ex.what();
      doc = json();
    }
    ranks.push_back(std::move(info));
  }

  std::int64_t origin = 0;
  if (!spans.empty())
    origin = std::min_element(spans.begin(), spans.end(), [](const span& a, const span& b) {
               return a.begin < b.begin;
             })->begin;

  json events = std::move(meta);
  std::map<std::uint64_t, std::vector<const span*>> flows;
  for (const span& s : spans) {
    const json& e = *s.entry;
    json args{{"seq", e.value("seq", std::uint64_t{0})},
              {"detail", e.value("detail", std::string())},
              {"peer", e.value("peer", std::string())},
              {"bytes", e.value("bytes", std::uint64_t{0})},
              {"state", e.value("state", std::string())}};
    if (const auto err = e.value("error", std::string()); !err.empty()) {
      args["error"] = err;
      args["error_type"] = e.value("error_type", std::string());
    }
    if (const auto where = e.value("where", std::string()); !where.empty())
      args["where"] = where;
    json ev{{"name", event_name(e)}, {"cat", e.value("op", std::string())}, {"pid", s.pid}, {"tid", s.tid},
            {"ts", micros(s.begin - origin)}, {"args", std::move(args)}};
    if (s.instant) {
      ev["ph"] = "i";
      ev["s"] = "t";
    } else {
      ev["ph"] = "X";
      ev["dur"] = micros(s.end - s.begin);
    }
    events.push_back(std::move(ev));
    if (const auto flow = e.value("flow", std::uint64_t{0}); flow != 0)
      flows[flow].push_back(&s);
  }
  // A flow starts at its caller's span ("call"; else the earliest) and ends in each other span.
  for (auto& [flow, members] : flows) {
    if (members.size() < 2)
      continue;
    std::stable_sort(members.begin(), members.end(), [](const span* a, const span* b) {
      const bool ca = a->entry->value("op", std::string()) == "call";
      const bool cb = b->entry->value("op", std::string()) == "call";
      return ca != cb ? ca : a->begin < b->begin;
    });
    const std::string id = flow_id(flow);
    const span& src = *members.front();
    events.push_back({{"ph", "s"}, {"name", "rpc"}, {"cat", "flow"}, {"id", id}, {"pid", src.pid},
                      {"tid", src.tid}, {"ts", micros(src.begin - origin)}});
    for (std::size_t i = 1; i < members.size(); ++i) {
      const span& dst = *members[i];
      events.push_back({{"ph", "f"}, {"bp", "e"}, {"name", "rpc"}, {"cat", "flow"}, {"id", id},
                        {"pid", dst.pid}, {"tid", dst.tid}, {"ts", micros(dst.begin - origin)}});
    }
  }

  json other{{"time_origin_unix_ns", origin},
             {"clock", "each rank's times are on the collector's system clock: steady time - dump's steady_ns + "
                       "dump's unix_ns - clock_offset_ns (the rank's clock minus the collector's, within "
                       "offset_error_ns)"},
             {"ranks", std::move(ranks)}};
  if (from != std::numeric_limits<std::int64_t>::min())
    other["window_from_unix_ns"] = from;
  if (to != std::numeric_limits<std::int64_t>::max())
    other["window_to_unix_ns"] = to;
  json out{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

} // namespace corodist::store
