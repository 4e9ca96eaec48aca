#include <corodist/core/flight_recorder.hpp>

#include "core/log.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace corodist {

namespace {

using clock = record_entry::clock;

/// The process's live recorders and its settings.
struct registry {
  std::mutex mutex;
  std::vector<const flight_recorder*> live;
  std::string label;
  std::shared_ptr<const flight_recorder::observer> obs;
  clock::time_point last_dump{};
  std::string last_path;
};

registry& reg() {
  static auto* r = new registry; // never destroyed: recorders may outlive static destruction
  return *r;
}

std::atomic<const flight_recorder::observer*> observer_ptr{nullptr};

std::size_t env_capacity(std::size_t fallback) {
  const char* v = std::getenv("CORODIST_RECORDER_SIZE");
  if (v == nullptr || *v == '\0')
    return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n == 0 || n > (1u << 24)) {
    CORODIST_LOG_WARN("CORODIST_RECORDER_SIZE={} is not a count from 1 to 16777216; using {}", v, fallback);
    return fallback;
  }
  return static_cast<std::size_t>(n);
}

std::int64_t ns_of(clock::time_point t) {
  return t == clock::time_point{} ? 0 : std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

} // namespace

std::string_view to_string(record_state s) noexcept {
  switch (s) {
  case record_state::queued: return "queued";
  case record_state::started: return "started";
  case record_state::completed: return "completed";
  case record_state::failed: return "failed";
  }
  return "unknown";
}

namespace {
std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("CORODIST_RECORDER");
    return v == nullptr || std::string_view(v) != "0";
  }()};
  return on;
}
} // namespace

bool flight_recorder::enabled() noexcept { return enabled_flag().load(std::memory_order_relaxed); }

void flight_recorder::set_enabled(bool on) noexcept { enabled_flag().store(on, std::memory_order_relaxed); }

std::shared_ptr<flight_recorder> flight_recorder::create(std::string layer, std::string name,
                                                         flight_recorder_options opts) {
  if (!enabled())
    return nullptr;
  std::size_t cap = opts.capacity;
  if (cap == flight_recorder_options::default_capacity)
    cap = env_capacity(cap);
  std::shared_ptr<flight_recorder> r(new flight_recorder(std::move(layer), std::move(name), std::max<std::size_t>(cap, 1)));
  auto& g = reg();
  std::lock_guard lk(g.mutex);
  g.live.push_back(r.get());
  return r;
}

flight_recorder::flight_recorder(std::string layer, std::string name, std::size_t capacity)
    : layer_(std::move(layer)), name_(std::move(name)), ring_(capacity) {}

flight_recorder::~flight_recorder() {
  auto& g = reg();
  std::lock_guard lk(g.mutex);
  std::erase(g.live, this);
}

flight_recorder::handle flight_recorder::record(const record_fields& f) {
  const auto now = clock::now();
  std::lock_guard lk(mutex_);
  const handle h = next_++;
  record_entry& e = ring_[h % ring_.size()];
  e.id = h;
  e.seq = f.seq;
  e.op.assign(f.op);
  e.detail.assign(f.detail);
  e.peer.assign(f.peer);
  e.where.assign(f.where);
  e.bytes = f.bytes;
  e.flow = f.flow;
  e.state = f.started ? record_state::started : record_state::queued;
  e.error.clear();
  e.error_type.clear();
  e.queued = now;
  e.started = f.started ? now : clock::time_point{};
  e.ended = clock::time_point{};
  return h;
}

void flight_recorder::start(handle h) {
  const auto now = clock::now();
  std::lock_guard lk(mutex_);
  record_entry& e = ring_[h % ring_.size()];
  if (e.id == h && e.state == record_state::queued) {
    e.state = record_state::started;
    e.started = now;
  }
}

void flight_recorder::set_link(handle h, std::uint64_t seq, std::uint64_t flow) {
  std::lock_guard lk(mutex_);
  record_entry& e = ring_[h % ring_.size()];
  if (e.id == h) {
    e.seq = seq;
    e.flow = flow;
  }
}

void flight_recorder::complete(handle h) { end(h, record_state::completed, {}, {}); }

void flight_recorder::fail(handle h, std::string_view error, std::string_view type) {
  end(h, record_state::failed, error, type);
}

void flight_recorder::end(handle h, record_state state, std::string_view error, std::string_view type) {
  const auto now = clock::now();
  const observer* obs = observer_ptr.load(std::memory_order_acquire);
  std::unique_lock lk(mutex_);
  record_entry& e = ring_[h % ring_.size()];
  if (e.id != h || e.state == record_state::completed || e.state == record_state::failed)
    return;
  if (e.started == clock::time_point{})
    e.started = now;
  e.state = state;
  e.ended = now;
  e.error.assign(error);
  e.error_type.assign(type);
  if (obs == nullptr)
    return;
  const record_entry copy = e;
  lk.unlock();
  (*obs)(*this, copy);
}

std::vector<record_entry> flight_recorder::entries() const {
  std::lock_guard lk(mutex_);
  std::vector<record_entry> out;
  const std::uint64_t n = std::min<std::uint64_t>(next_ - 1, ring_.size());
  out.reserve(n);
  for (std::uint64_t h = next_ - n; h < next_; ++h)
    out.push_back(ring_[h % ring_.size()]);
  return out;
}

std::vector<record_entry> flight_recorder::pending() const {
  std::lock_guard lk(mutex_);
  std::vector<record_entry> out;
  const std::uint64_t n = std::min<std::uint64_t>(next_ - 1, ring_.size());
  for (std::uint64_t h = next_ - n; h < next_; ++h) {
    const record_entry& e = ring_[h % ring_.size()];
    if (e.state == record_state::queued || e.state == record_state::started)
      out.push_back(e);
  }
  return out;
}

std::uint64_t flight_recorder::recorded() const {
  std::lock_guard lk(mutex_);
  return next_ - 1;
}

void flight_recorder::set_observer(observer obs) {
  auto& g = reg();
  std::lock_guard lk(g.mutex);
  // The old observer stays allocated: a thread may be calling it.
  g.obs = obs ? std::make_shared<const observer>(std::move(obs)) : nullptr;
  static std::vector<std::shared_ptr<const observer>> retired;
  if (g.obs)
    retired.push_back(g.obs);
  observer_ptr.store(g.obs.get(), std::memory_order_release);
}

std::vector<pending_record> pending_flight_records() {
  std::vector<pending_record> out;
  auto& g = reg();
  std::lock_guard lk(g.mutex);
  for (const flight_recorder* r : g.live) // (only the entries not ended are copied: a scan runs every second)
    for (auto& e : r->pending())
      out.push_back({r->layer(), r->name(), std::move(e)});
  return out;
}

void set_flight_recorder_label(std::string label) {
  auto& g = reg();
  std::lock_guard lk(g.mutex);
  g.label = std::move(label);
}

std::string dump_flight_recorders() {
  using nlohmann::json;
  const auto steady_now = clock::now();
  const auto unix_now = std::chrono::system_clock::now();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  json doc{{"pid", ::getpid()},
           {"host", host},
           {"unix_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(unix_now.time_since_epoch()).count()},
           {"steady_ns", ns_of(steady_now)}};
  json recs = json::array();
  auto& g = reg();
  std::lock_guard lk(g.mutex); // keeps every listed recorder alive while it is read
  doc["label"] = g.label;
  for (const flight_recorder* r : g.live) {
    json entries = json::array();
    for (const record_entry& e : r->entries()) {
      const auto until = e.ended == clock::time_point{} ? steady_now : e.ended;
      const auto from = e.started == clock::time_point{} ? e.queued : e.started;
      entries.push_back({{"id", e.id},
                         {"seq", e.seq},
                         {"op", e.op},
                         {"detail", e.detail},
                         {"peer", e.peer},
                         {"where", e.where},
                         {"bytes", e.bytes},
                         {"flow", e.flow},
                         {"state", to_string(e.state)},
                         {"error", e.error},
                         {"error_type", e.error_type},
                         {"queued_ns", ns_of(e.queued)},
                         {"started_ns", ns_of(e.started)},
                         {"ended_ns", ns_of(e.ended)},
                         {"age_ms", std::chrono::duration<double, std::milli>(until - from).count()}});
    }
    recs.push_back({{"layer", r->layer()},
                    {"name", r->name()},
                    {"capacity", r->capacity()},
                    {"recorded", r->recorded()},
                    {"entries", std::move(entries)}});
  }
  doc["recorders"] = std::move(recs);
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string write_flight_recorder_dump(std::string_view reason) {
  if (!flight_recorder::enabled())
    return {};
  auto& g = reg();
  {
    std::lock_guard lk(g.mutex);
    const auto now = clock::now();
    if (!g.last_path.empty() && now - g.last_dump < std::chrono::seconds(1))
      return g.last_path;
    g.last_dump = now;
  }
  std::error_code ec;
  std::filesystem::path dir;
  if (const char* d = std::getenv("CORODIST_RECORDER_DUMP_DIR"); d != nullptr && *d != '\0')
    dir = d;
  else
    dir = std::filesystem::temp_directory_path(ec);
  std::filesystem::create_directories(dir, ec); // (a failure shows below, as the file's)
  const auto path = dir / ("corodist-recorder-" + std::to_string(::getpid()) + ".json");
  const std::string text = dump_flight_recorders();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    CORODIST_LOG_WARN("flight recorder: cannot write {} ({})", path.string(), reason);
    return {};
  }
  CORODIST_LOG_WARN("flight recorder: wrote {} ({})", path.string(), reason);
  std::lock_guard lk(g.mutex);
  g.last_path = path.string();
  return g.last_path;
}

} // namespace corodist
