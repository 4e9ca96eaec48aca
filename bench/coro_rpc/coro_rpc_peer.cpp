/// \file
/// yalantinglibs' coro_rpc (0.6.1) measured the way corodist-bench's `rpc`
/// suite measures corodist (bench/rpc_suite.cpp): the same four cases, the
/// same sample counts, warm-ups, time budgets and percentiles, so that the
/// two can be run one after the other in the same quiet window.
///
/// A server process (one coro_rpc io thread) and a client process (this one),
/// forked, over 127.0.0.1 on an ephemeral port. `--pin` pins both processes,
/// every thread, to one CPU (CPU 0 when allowed) before the fork, as
/// corodist-bench --pin does.
///
/// Cases (names as in corodist-bench, suite "coro_rpc"):
///  * rpc_sync_empty: a plain thread, syncAwait(client.call<noop>()) each time;
///  * call_empty_coroutine: one coroutine on the client's executor,
///    co_await client.call<noop>() in a loop (no thread handoff);
///  * rpc_async_x64: 64 coroutines on the client's executor, each keeping one
///    call of add(1, 2) in flight on the one connection (send_request, then
///    co_await its response);
///  * echo_64MiB: 64 MiB out as the request attachment, back as the response
///    attachment; GB/s from the median round trip, both directions counted.
///
/// Not part of corodist's build: coro_rpc is not a Debian package.
/// Build: bash bench/coro_rpc/build.sh YLT_DIR [OUT].

#include <ylt/coro_rpc/coro_rpc_client.hpp>
#include <ylt/coro_rpc/coro_rpc_server.hpp>
#include <ylt/easylog.hpp>
#include <ylt/version.hpp>

#include "../pin_cpu.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

using async_simple::coro::Lazy;
using async_simple::coro::syncAwait;
using clock_type = std::chrono::steady_clock;

// ---- server functions ------------------------------------------------------
// Plain functions run inline on the connection's io thread (coro_rpc's own
// advice for cheap functions); the *_coro ones are coroutine functions, as
// corodist's bench functions are (--handlers coro).

void noop() {}
int add(int x, int y) { return x + y; }
void echo() {
  auto* ctx = coro_rpc::get_context();
  // Moves the received buffer into the response: no copy.
  ctx->set_response_attachment(ctx->release_request_attachment());
}

Lazy<void> noop_coro() { co_return; }
Lazy<int> add_coro(int x, int y) { co_return x + y; }
Lazy<void> echo_coro() {
  auto* ctx = co_await coro_rpc::get_context_in_coro();
  ctx->set_response_attachment(ctx->release_request_attachment());
}

namespace {

constexpr int pipeline_depth = 64;
constexpr std::size_t echo_bytes = std::size_t{64} << 20;


/// This process's threads, and how many of them may run on a CPU other than
/// `cpu` (a check that --pin covered the threads coro_rpc started).
std::pair<int, int> threads_and_unpinned(int cpu) {
  int threads = 0, unpinned = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir)) {
      const int tid = std::atoi(entry->d_name);
      if (tid <= 0) continue;
      ++threads;
      cpu_set_t set;
      CPU_ZERO(&set);
      if (::sched_getaffinity(tid, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1 || !CPU_ISSET(cpu, &set))
        ++unpinned;
    }
    ::closedir(dir);
  }
  return {threads, unpinned};
}

// ---- recording (as bench/harness.cpp latency_recorder) ---------------------

class latency_recorder {
public:
  explicit latency_recorder(std::size_t capacity = 0) { samples_ns_.reserve(capacity); }
  void add(clock_type::duration d) {
    samples_ns_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  }
  std::size_t size() const { return samples_ns_.size(); }
  /// The q-quantile in µs, linearly interpolated; NaN when empty.
  double percentile(double q) {
    if (samples_ns_.empty()) return NAN;
    std::sort(samples_ns_.begin(), samples_ns_.end());
    const double pos = q * static_cast<double>(samples_ns_.size() - 1);
    const auto lo = static_cast<std::size_t>(pos);
    const auto hi = std::min(lo + 1, samples_ns_.size() - 1);
    const double frac = pos - static_cast<double>(lo);
    return (static_cast<double>(samples_ns_[lo]) +
            frac * static_cast<double>(samples_ns_[hi] - samples_ns_[lo])) /
           1000.0;
  }

private:
  std::vector<std::int64_t> samples_ns_;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct result {
  std::string name;
  double p50_us = NAN, p99_us = NAN, calls_per_s = NAN, gbytes_per_s = NAN;
  std::size_t samples = 0;
};

struct options {
  bool pin = false;
  bool quick = false;
  bool coro_handlers = false;
  std::string json;
  std::vector<std::string> cases{"rpc_sync_empty", "call_empty_coroutine", "rpc_async_x64", "echo_64MiB"};
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

// ---- the cases ---------------------------------------------------------------

/// rpc_sync_empty: samples 20'000 (--quick) / 200'000, warm-up a tenth (at
/// least 10), time budget 4 s / 30 s.
template <auto Noop>
result sync_empty(coro_rpc::coro_rpc_client& client, const options& o) {
  const std::size_t samples = o.quick ? 20'000 : 200'000;
  const double budget_s = o.quick ? 4.0 : 30.0;
  auto one = [&] {
    auto r = syncAwait(client.call<Noop>());
    check(r.has_value(), "rpc_sync_empty: call failed");
  };
  for (std::size_t i = 0; i < std::max<std::size_t>(samples / 10, 10); ++i) one();
  latency_recorder rec(samples);
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < samples; ++i) {
    const auto t0 = clock_type::now();
    one();
    const auto t1 = clock_type::now();
    rec.add(t1 - t0);
    if (std::chrono::duration<double>(t1 - start).count() > budget_s) break;
  }
  const double elapsed = seconds_since(start);
  return {"rpc_sync_empty", rec.percentile(0.5), rec.percentile(0.99), double(rec.size()) / elapsed, NAN,
          rec.size()};
}

/// call_empty_coroutine: one coroutine on the client's own executor (the
/// thread its connection's completions run on), 20'000 / 200'000 samples,
/// warm-up a tenth, 4 s / 30 s budget.
template <auto Noop>
result coroutine_empty(coro_rpc::coro_rpc_client& client, const options& o) {
  const std::size_t samples = o.quick ? 20'000 : 200'000;
  const double budget_s = o.quick ? 4.0 : 30.0;
  latency_recorder rec(samples);
  double elapsed = 0;
  auto loop = [&]() -> Lazy<void> {
    for (std::size_t i = 0; i < samples / 10; ++i) {
      auto r = co_await client.call<Noop>();
      check(r.has_value(), "call_empty_coroutine: call failed");
    }
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < samples; ++i) {
      const auto t0 = clock_type::now();
      auto r = co_await client.call<Noop>();
      const auto t1 = clock_type::now();
      check(r.has_value(), "call_empty_coroutine: call failed");
      rec.add(t1 - t0);
      if (std::chrono::duration<double>(t1 - start).count() > budget_s) break;
    }
    elapsed = seconds_since(start);
  };
  syncAwait(loop().via(&client.get_executor()));
  return {"call_empty_coroutine", rec.percentile(0.5), rec.percentile(0.99), double(rec.size()) / elapsed, NAN,
          rec.size()};
}

/// rpc_async_x64: 64 coroutines on the client's executor, each keeping one
/// add(1, 2) in flight on the one connection, until 200'000 / 1'000'000
/// calls have been issued (as bench/closed_loop.hpp).
template <auto Add>
result async_x64(coro_rpc::coro_rpc_client& client, const options& o) {
  const std::size_t total = o.quick ? 200'000 : 1'000'000;
  latency_recorder rec(total);
  std::size_t issued = 0;
  std::size_t off_thread = 0; // resumptions away from the executor's thread (expected 0)
  std::thread::id loop_thread;
  auto worker = [&]() -> Lazy<void> {
    while (issued < total) {
      ++issued;
      const auto t0 = clock_type::now();
      auto response = co_await client.send_request<Add>(1, 2);
      auto r = co_await std::move(response);
      rec.add(clock_type::now() - t0);
      check(r.has_value() && r->result() == 3, "rpc_async_x64: call failed");
      if (std::this_thread::get_id() != loop_thread) ++off_thread;
    }
  };
  double elapsed = 0;
  auto run = [&]() -> Lazy<void> {
    loop_thread = std::this_thread::get_id();
    std::vector<Lazy<void>> workers;
    for (int w = 0; w < pipeline_depth; ++w) workers.push_back(worker());
    const auto start = clock_type::now();
    auto done = co_await async_simple::coro::collectAll(std::move(workers));
    elapsed = seconds_since(start);
    for (auto& t : done) t.value(); // rethrows a worker's failure
  };
  syncAwait(run().via(&client.get_executor()));
  check(off_thread == 0, "rpc_async_x64: a worker resumed off the client's executor thread");
  return {"rpc_async_x64", rec.percentile(0.5), rec.percentile(0.99), double(rec.size()) / elapsed, NAN,
          rec.size()};
}

/// echo_64MiB: one warm-up, then 3 / 10 rounds from a plain thread; the
/// request attachment is sent from the caller's buffer, the response lands
/// in the client's own buffer.
template <auto Echo>
result echo_64MiB(coro_rpc::coro_rpc_client& client, const options& o) {
  const int rounds = o.quick ? 3 : 10;
  const std::string data(echo_bytes, '\x07');
  auto one = [&] {
    client.set_req_attachment(data);
    auto r = syncAwait(client.call<Echo>());
    check(r.has_value(), "echo_64MiB: call failed");
    check(client.get_resp_attachment().size() == echo_bytes, "echo_64MiB: size mismatch");
  };
  one(); // warm-up
  latency_recorder rec(rounds);
  const auto start = clock_type::now();
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = clock_type::now();
    one();
    rec.add(clock_type::now() - t0);
  }
  const double elapsed = seconds_since(start);
  const double p50 = rec.percentile(0.5);
  return {"echo_64MiB", p50, rec.percentile(0.99), double(rec.size()) / elapsed,
          2.0 * double(echo_bytes) / (p50 * 1e-6) / 1e9, rec.size()};
}

template <auto Noop, auto Add, auto Echo>
std::vector<result> run_cases(coro_rpc::coro_rpc_client& client, const options& o) {
  std::vector<result> out;
  for (const auto& c : o.cases) {
    std::fprintf(stderr, "# %s...\n", c.c_str());
    if (c == "rpc_sync_empty") out.push_back(sync_empty<Noop>(client, o));
    else if (c == "call_empty_coroutine") out.push_back(coroutine_empty<Noop>(client, o));
    else if (c == "rpc_async_x64") out.push_back(async_x64<Add>(client, o));
    else if (c == "echo_64MiB") out.push_back(echo_64MiB<Echo>(client, o));
    else throw std::runtime_error("unknown case: " + c);
  }
  return out;
}

// ---- processes ---------------------------------------------------------------

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

std::string read_line(int fd) {
  std::string s;
  char ch;
  for (;;) {
    const ssize_t n = ::read(fd, &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || ch == '\n') return s;
    s.push_back(ch);
  }
}

/// The server process: one io thread, 127.0.0.1, port 0. Reports "PORT
/// THREADS UNPINNED" on `report_fd`, then serves until `stop_fd` reaches EOF.
[[noreturn]] void run_server(int report_fd, int stop_fd, int cpu) {
  easylog::set_min_severity(easylog::Severity::WARN);
  int rc = 0;
  {
    coro_rpc::coro_rpc_server server(/*thread_num=*/1, /*port=*/0, /*address=*/"127.0.0.1");
    server.register_handler<noop, add, echo, noop_coro, add_coro, echo_coro>();
    auto started = server.async_start();
    if (started.hasResult()) {
      std::fprintf(stderr, "coro_rpc_peer: the server failed to start\n");
      write_all(report_fd, "0 0 0\n");
      ::_exit(1);
    }
    const auto [threads, unpinned] = cpu >= 0 ? threads_and_unpinned(cpu) : std::pair{0, 0};
    write_all(report_fd,
              std::to_string(server.port()) + " " + std::to_string(threads) + " " + std::to_string(unpinned) + "\n");
    char ch;
    for (;;) {
      const ssize_t n = ::read(stop_fd, &ch, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    server.stop();
  }
  ::_exit(rc);
}

void print_json(const std::string& path, const std::vector<result>& results, const options& o, int cpu) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot write " + path);
  auto num = [](double v) { return std::isfinite(v) ? std::to_string(v) : std::string("null"); };
  for (const auto& r : results)
    std::fprintf(f,
                 "{\"suite\": \"coro_rpc\", \"case\": \"%s\", \"p50_us\": %s, \"p99_us\": %s, \"calls_per_s\": %s, "
                 "\"gbytes_per_s\": %s, \"samples\": %zu, \"pinned_cpu\": %d, \"quick\": %s, \"handlers\": \"%s\", "
                 "\"ylt_version\": %d}\n",
                 r.name.c_str(), num(r.p50_us).c_str(), num(r.p99_us).c_str(), num(r.calls_per_s).c_str(),
                 num(r.gbytes_per_s).c_str(), r.samples, cpu, o.quick ? "true" : "false",
                 o.coro_handlers ? "coro" : "plain", YLT_VERSION);
  std::fclose(f);
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: coro_rpc_peer [--pin] [--quick] [--json FILE] [--handlers plain|coro] [--cases a,b,...]\n"
               "  --pin       pin server and client processes (all threads) to one CPU (CPU 0 when allowed)\n"
               "  --quick     fewer samples (as corodist-bench --quick)\n"
               "  --json F    one JSON object per case, one a line, to F\n"
               "  --handlers  plain (default): plain server functions; coro: coroutine server functions\n"
               "  --cases     of rpc_sync_empty,call_empty_coroutine,rpc_async_x64,echo_64MiB (default: all)\n");
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage(stderr);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--pin") o.pin = true;
    else if (a == "--quick") o.quick = true;
    else if (a == "--json") o.json = value();
    else if (a == "--handlers") {
      const auto h = value();
      if (h != "plain" && h != "coro") {
        usage(stderr);
        return 2;
      }
      o.coro_handlers = h == "coro";
    } else if (a == "--cases") {
      o.cases.clear();
      std::string list = value();
      for (std::size_t pos = 0; pos <= list.size();) {
        const auto comma = std::min(list.find(',', pos), list.size());
        if (comma > pos) o.cases.push_back(list.substr(pos, comma - pos));
        pos = comma + 1;
      }
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }

  for (const auto& c : o.cases)
    if (c != "rpc_sync_empty" && c != "call_empty_coroutine" && c != "rpc_async_x64" && c != "echo_64MiB") {
      std::fprintf(stderr, "coro_rpc_peer: unknown case: %s\n", c.c_str());
      usage(stderr);
      return 2;
    }

  // Pin before the fork and before any thread exists: the server process and
  // every thread either process starts inherit the one CPU.
  int cpu = -1;
  if (o.pin && (cpu = corodist::bench::pin_process_to_one_cpu("coro_rpc_peer")) < 0) return 1;

  int report[2], stop[2];
  if (::pipe(report) != 0 || ::pipe(stop) != 0) {
    std::perror("pipe");
    return 1;
  }
  const pid_t server_pid = ::fork();
  if (server_pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (server_pid == 0) {
    ::close(report[0]);
    ::close(stop[1]);
    if (o.pin) corodist::bench::pin_process_to_one_cpu("coro_rpc_peer");
    run_server(report[1], stop[0], cpu);
  }
  ::close(report[1]);
  ::close(stop[0]);
  easylog::set_min_severity(easylog::Severity::WARN);

  int rc = 0;
  try {
    const std::string line = read_line(report[0]);
    unsigned port = 0;
    int server_threads = 0, server_unpinned = 0;
    if (std::sscanf(line.c_str(), "%u %d %d", &port, &server_threads, &server_unpinned) != 3 || port == 0)
      throw std::runtime_error("the server process did not start");

    std::vector<result> results;
    {
      coro_rpc::coro_rpc_client client;
      auto ec = syncAwait(client.connect("127.0.0.1", std::to_string(port)));
      if (ec) throw std::runtime_error(std::string("connect: ") + std::string(ec.message()));

      std::printf("# coro_rpc (yalantinglibs YLT_VERSION %d), server 127.0.0.1:%u, handlers %s%s\n", YLT_VERSION,
                  port, o.coro_handlers ? "coro" : "plain", o.quick ? ", quick" : "");
      if (cpu >= 0) {
        const auto [threads, unpinned] = threads_and_unpinned(cpu);
        std::printf("# pinned to CPU %d: client %d threads (%d not pinned), server %d threads (%d not pinned)\n", cpu,
                    threads, unpinned, server_threads, server_unpinned);
        if (unpinned != 0 || server_unpinned != 0) throw std::runtime_error("--pin did not cover every thread");
      } else {
        std::printf("# not pinned\n");
      }
      std::fflush(stdout);

      results = o.coro_handlers ? run_cases<noop_coro, add_coro, echo_coro>(client, o)
                                : run_cases<noop, add, echo>(client, o);
      client.close();
    }

    auto cell = [](double v, int digits) {
      char buf[32];
      if (!std::isfinite(v)) return std::string("-");
      std::snprintf(buf, sizeof buf, "%.*f", digits, v);
      return std::string(buf);
    };
    std::printf("%-10s %-22s %10s %10s %12s %8s %9s\n", "suite", "case", "p50_us", "p99_us", "calls/s", "GB/s",
                "samples");
    for (const auto& r : results)
      std::printf("%-10s %-22s %10s %10s %12s %8s %9zu\n", "coro_rpc", r.name.c_str(), cell(r.p50_us, 2).c_str(),
                  cell(r.p99_us, 2).c_str(), cell(r.calls_per_s, 0).c_str(), cell(r.gbytes_per_s, 2).c_str(),
                  r.samples);
    std::fflush(stdout);
    if (!o.json.empty()) print_json(o.json, results, o, cpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coro_rpc_peer: %s\n", e.what());
    rc = 1;
  }

  ::close(stop[1]); // the server stops at EOF
  int status = 0;
  while (::waitpid(server_pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "coro_rpc_peer: server process ended abnormally (status %d)\n", status);
    rc = 1;
  }
  return rc;
}
