#include "harness.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <thread>

#include <unistd.h>

namespace corodist::bench {

// ---- latency_recorder ------------------------------------------------------

void latency_recorder::add_us(double sample_us) {
  samples_ns_.push_back(static_cast<std::int64_t>(std::llround(sample_us * 1000.0)));
  sorted_ = false;
}

double latency_recorder::percentile(double q) const {
  if (samples_ns_.empty()) return not_applicable;
  if (!sorted_) {
    std::sort(samples_ns_.begin(), samples_ns_.end());
    sorted_ = true;
  }
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * static_cast<double>(samples_ns_.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const auto hi = std::min(lo + 1, samples_ns_.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  const double ns = static_cast<double>(samples_ns_[lo]) +
                    frac * static_cast<double>(samples_ns_[hi] - samples_ns_[lo]);
  return ns / 1000.0;
}

double latency_recorder::mean_us() const {
  if (samples_ns_.empty()) return not_applicable;
  long double sum = 0;
  for (auto s : samples_ns_) sum += static_cast<long double>(s);
  return static_cast<double>(sum / static_cast<long double>(samples_ns_.size())) / 1000.0;
}

record latency_record(std::string suite, std::string name, const latency_recorder& latency,
                      double elapsed_s) {
  record r;
  r.suite = std::move(suite);
  r.name = std::move(name);
  r.p50_us = latency.percentile(0.50);
  r.p99_us = latency.percentile(0.99);
  if (elapsed_s > 0) r.ops_per_s = static_cast<double>(latency.size()) / elapsed_s;
  return r;
}

// ---- reporting -------------------------------------------------------------

namespace {

bool present(double v) { return std::isfinite(v); }

/// Table cell: "-" for NaN, else fixed with `decimals` places.
std::string cell(double v, int decimals) {
  if (!present(v)) return "-";
  return fmt::format("{:.{}f}", v, decimals);
}

double ratio_of(const record& r) {
  if (r.kind == kind_error_path) return not_applicable; // a failure's time is not a round trip
  if (present(r.p50_us) && present(r.raw_p50_us) && r.raw_p50_us > 0) return r.p50_us / r.raw_p50_us;
  if (present(r.gbytes_per_s) && present(r.raw_gbytes_per_s) && r.raw_gbytes_per_s > 0)
    return r.gbytes_per_s / r.raw_gbytes_per_s;
  return not_applicable;
}

void append_json_string(fmt::memory_buffer& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
    case '"': out.append(std::string_view("\\\"")); break;
    case '\\': out.append(std::string_view("\\\\")); break;
    case '\n': out.append(std::string_view("\\n")); break;
    case '\r': out.append(std::string_view("\\r")); break;
    case '\t': out.append(std::string_view("\\t")); break;
    default:
      if (static_cast<unsigned char>(c) < 0x20)
        fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
      else
        out.push_back(c);
    }
  }
  out.push_back('"');
}

/// Appends `,"key":value`, or nothing when the value is NaN/inf (not valid JSON).
void append_json_number(fmt::memory_buffer& out, std::string_view key, double v) {
  if (!present(v)) return;
  out.push_back(',');
  append_json_string(out, key);
  // "{}" is the shortest representation that round-trips: exact and valid JSON.
  fmt::format_to(std::back_inserter(out), ":{}", v);
}

constexpr const char* row_format = "{:<8} {:<26} {:>10} {:>10} {:>12} {:>8} {:>7}  {:<28} {:>14} {:>8}";

/// The peer's figure that speedup_vs_peer compares, with its unit.
std::string peer_figure(const peer_result& p) {
  if (!p.status.empty()) return p.status;
  if (present(p.p50_us)) return fmt::format("{:.1f} us", p.p50_us);
  if (present(p.ops_per_s)) return fmt::format("{:.0f}/s", p.ops_per_s);
  if (present(p.gbytes_per_s)) return fmt::format("{:.2f} GB/s", p.gbytes_per_s);
  return "-";
}

} // namespace

const char* backend_name() noexcept {
#if CORODIST_IO_URING // always defined: 1 in the io_uring build, 0 in the epoll build
  return "io_uring";
#else
  return "epoll";
#endif
}

double speedup_vs_peer(const record& r, const peer_result& p) {
  if (!p.status.empty() || !p.comparable) return not_applicable;
  if (present(p.p50_us)) return present(r.p50_us) && r.p50_us > 0 ? p.p50_us / r.p50_us : not_applicable;
  if (present(p.ops_per_s)) return present(r.ops_per_s) && p.ops_per_s > 0 ? r.ops_per_s / p.ops_per_s : not_applicable;
  if (present(p.gbytes_per_s))
    return present(r.gbytes_per_s) && p.gbytes_per_s > 0 ? r.gbytes_per_s / p.gbytes_per_s : not_applicable;
  return not_applicable;
}

void context::report(record r) {
  if (!present(r.raw_p50_us)) r.raw_p50_us = raw_p50_us;
  if (!present(r.raw_gbytes_per_s)) r.raw_gbytes_per_s = raw_gbytes_per_s;

  // Headline figures of cases that are neither latency nor bandwidth go after the row.
  std::string notes;
  for (const auto& [key, value] : r.extra)
    if (key == "rendezvous_s" || key == "bytes_per_conn" || key == "raw_fanin_ops_per_s" || key == "of_raw_fanin" ||
        key == "busbw_gbps" || key == "check_pct" || key == "overhead_pct" || key == "server_idle_cpu_pct")
      notes += key.ends_with("ops_per_s") ? fmt::format("  {}={:.0f}", key, value)
                                          : fmt::format("  {}={:.4g}", key, value);
  for (const auto& [key, value] : r.text)
    if (key == "error")
      notes += fmt::format("  {}={}", key, value);
  // One row (and one JSON line) per peer; the case's own figures repeat.
  std::vector<const peer_result*> peers;
  for (const auto& p : r.peers) peers.push_back(&p);
  if (peers.empty()) peers.push_back(nullptr);

  if (status != nullptr) status->pause();
  for (const peer_result* p : peers) {
    fmt::print(table_out, row_format, r.suite, r.name, cell(r.p50_us, 2), cell(r.p99_us, 2), cell(r.ops_per_s, 0),
               cell(r.gbytes_per_s, 2), cell(ratio_of(r), 2), p ? p->name : "", p ? peer_figure(*p) : "",
               p ? cell(speedup_vs_peer(r, *p), 2) : "");
    fmt::print(table_out, "{}{}\n", p == peers.front() ? notes : "", p && !p->note.empty() ? "  (" + p->note + ")" : "");
  }
  std::fflush(table_out);
  if (status != nullptr) status->case_reported(r.name);

  if (json_out == nullptr) return;
  for (const peer_result* p : peers) {
    fmt::memory_buffer out;
    out.append(std::string_view("{\"suite\":"));
    append_json_string(out, r.suite);
    out.append(std::string_view(",\"case\":"));
    append_json_string(out, r.name);
    append_json_number(out, "p50_us", r.p50_us);
    append_json_number(out, "p99_us", r.p99_us);
    append_json_number(out, "ops_per_s", r.ops_per_s);
    append_json_number(out, "gbytes_per_s", r.gbytes_per_s);
    append_json_number(out, "raw_p50_us", r.raw_p50_us);
    append_json_number(out, "raw_gbytes_per_s", r.raw_gbytes_per_s);
    for (const auto& [key, value] : r.extra) append_json_number(out, key, value);
    for (const auto& [key, value] : r.text) {
      out.append(std::string_view(","));
      append_json_string(out, key);
      out.append(std::string_view(":"));
      append_json_string(out, value);
    }
    if (!r.kind.empty()) {
      out.append(std::string_view(",\"kind\":"));
      append_json_string(out, r.kind);
    }
    if (p != nullptr) {
      out.append(std::string_view(",\"peer\":"));
      append_json_string(out, p->name);
      if (!p->status.empty()) {
        out.append(std::string_view(",\"peer_status\":"));
        append_json_string(out, p->status);
      }
      append_json_number(out, "peer_p50_us", p->p50_us);
      append_json_number(out, "peer_ops_per_s", p->ops_per_s);
      append_json_number(out, "peer_gbytes_per_s", p->gbytes_per_s);
      append_json_number(out, "speedup_vs_peer", speedup_vs_peer(r, *p));
      if (!p->note.empty()) {
        out.append(std::string_view(",\"peer_note\":"));
        append_json_string(out, p->note);
      }
    }
    out.append(std::string_view(",\"backend\":"));
    append_json_string(out, backend);
    fmt::format_to(std::back_inserter(out), ",\"mode\":\"{}\",\"pinned\":{}}}\n", quick ? "quick" : "full", pinned);
    std::fwrite(out.data(), 1, out.size(), json_out);
  }
  std::fflush(json_out);
}

void context::print_header() const {
  char date[64] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (localtime_r(&now, &tm) != nullptr) std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %z", &tm);
  fmt::print(table_out, "# corodist-bench  backend={}  date={}  mode={}  pinned={}\n", backend, date,
             quick ? "quick" : "full", pinned ? "yes" : "no");
  fmt::print(table_out, "# raw floor: 64 B TCP ping-pong p50 {} us, bulk {} GB/s (ratio = p50/raw p50, "
             "or GB/s / raw GB/s for throughput cases)\n",
             cell(raw_p50_us, 2), cell(raw_gbytes_per_s, 2));
  fmt::print(table_out, "# peer: measured in this run with the same pinning; vs_peer > 1 means corodist is better "
             "(peer p50 / our p50, or our ops/s or GB/s / the peer's)\n");
  if (status != nullptr) status->pause();
  fmt::print(table_out, row_format, "suite", "case", "p50_us", "p99_us", "ops/s", "GB/s", "ratio", "peer",
             "peer figure", "vs_peer");
  fmt::print(table_out, "\n");
  std::fflush(table_out);
}

// ---- registry --------------------------------------------------------------

namespace {
/// Function-local static: safe to use from other translation units' static
/// initialisers, whatever the initialisation order.
std::vector<suite_entry>& registry() {
  static std::vector<suite_entry> suites;
  return suites;
}
} // namespace

suite_registrar::suite_registrar(const char* name, suite_fn fn, int order, int cases) {
  registry().push_back(suite_entry{name, fn, order, cases});
}

std::vector<suite_entry> registered_suites() {
  auto suites = registry();
  std::sort(suites.begin(), suites.end(), [](const suite_entry& a, const suite_entry& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  return suites;
}

// ---- progress --------------------------------------------------------------

struct progress::state {
  std::vector<suite_entry> suites;
  bool tty = ::isatty(2) == 1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  bool line_shown = false;
  std::size_t suite = 0;
  bool suite_running = false;
  int done_in_suite = 0;
  int done_total = 0;
  std::string last_case;
  std::string doing;
  std::thread ticker;

  std::string text() const {
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
    std::string t = fmt::format("[{:02}:{:02}] ", secs / 60, secs % 60);
    if (!suite_running) return t + fmt::format("{} cases done", done_total);
    const auto& s = suites[suite];
    t += fmt::format("suite {} ({}/{})", s.name, suite + 1, suites.size());
    if (s.cases > 0)
      t += fmt::format(", case {}/{}", std::min(done_in_suite + 1, s.cases), s.cases);
    else
      t += fmt::format(", case {}", done_in_suite + 1);
    if (!last_case.empty()) t += " after " + last_case;
    if (!doing.empty()) t += ": " + doing;
    // Cases left: the rest of this suite and the suites after it (where known).
    int left = s.cases > 0 ? std::max(0, s.cases - done_in_suite) : 0;
    bool unknown = s.cases == 0;
    for (std::size_t i = suite + 1; i < suites.size(); ++i) {
      left += suites[i].cases;
      unknown = unknown || suites[i].cases == 0;
    }
    t += fmt::format(" | {}{} cases left", left, unknown ? "+" : "");
    return t;
  }

  // With the mutex held.
  void draw() {
    if (stopping) return;
    if (tty) {
      auto t = text();
      fmt::print(stderr, "\r\033[K{}", t);
      line_shown = true;
    } else {
      fmt::print(stderr, "corodist-bench {}\n", text());
    }
    std::fflush(stderr);
  }
  void clear() {
    if (tty && line_shown) {
      fmt::print(stderr, "\r\033[K");
      std::fflush(stderr);
      line_shown = false;
    }
  }
};

progress::progress(std::vector<suite_entry> suites) : s_(std::make_unique<state>()) {
  s_->suites = std::move(suites);
  if (s_->tty)
    s_->ticker = std::thread([st = s_.get()] {
      std::unique_lock lock(st->mutex);
      while (!st->stopping) {
        st->wake.wait_for(lock, std::chrono::seconds(1));
        if (!st->stopping && st->line_shown) st->draw();
      }
    });
}

progress::~progress() {
  {
    std::lock_guard lock(s_->mutex);
    s_->clear();
    s_->stopping = true;
  }
  s_->wake.notify_all();
  if (s_->ticker.joinable()) s_->ticker.join();
}

void progress::suite_started(std::size_t index) {
  std::lock_guard lock(s_->mutex);
  s_->suite = std::min(index, s_->suites.size() - 1);
  s_->suite_running = true;
  s_->done_in_suite = 0;
  s_->last_case.clear();
  s_->doing.clear();
  s_->draw();
}

void progress::note(std::string what) {
  std::lock_guard lock(s_->mutex);
  s_->doing = std::move(what);
  s_->draw();
}

void progress::pause() {
  std::lock_guard lock(s_->mutex);
  s_->clear();
}

void progress::case_reported(const std::string& name) {
  std::lock_guard lock(s_->mutex);
  ++s_->done_in_suite;
  ++s_->done_total;
  s_->last_case = name;
  s_->doing.clear();
  if (s_->tty) s_->draw();
}

} // namespace corodist::bench
