// Suite "ft": what fault tolerance costs and how fast it acts.
//   quorum_healthy      ft::manager's start_step + should_commit in a step where
//                       nothing changes (4 replica processes), and its share
//                       of a 100 ms step;
//   kill9_to_commit     examples/ft_train.cpp with 4 replicas: from the kill -9
//                       of one to the survivors' next committed step; peer:
//                       torchrun 1.13 (--max-restarts) + DDP on gloo, from the
//                       kill -9 of a worker to the first step after the restart;
//   recover_<size>      a joining replica's start_step that receives 100 MiB /
//                       1 GiB of state from a healthy one (2 + 1 replicas).
// The replicas' store is a store_server in this process (the launcher's place).
#include "forked_ranks.hpp"
#include "harness.hpp"
#include "peers.hpp"
#include "subprocess.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/ft/manager.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* python = "/usr/bin/python3";
constexpr int peer_timeout_ms = 1000; // the detection deadline of the runs (CORODIST_PEER_TIMEOUT_MS)

/// A store_server on a loop of its own: the launcher's store.
struct store_host {
  event_loop loop;
  std::shared_ptr<store::store_server> server;
  store_host() {
    loop.start();
    store::server_options so;
    so.host = "127.0.0.1";
    so.port = 0;
    server = store::store_server::start(loop.get_executor(), so);
  }
  ~store_host() { server->stop(); }
  std::uint16_t port() const { return server->local_endpoint().port(); }
};

/// Runs `body(store)` in this (forked) process on a fresh io_context with a store client.
int run_replica(std::uint16_t port, const std::function<asio::awaitable<void>(std::shared_ptr<store::store>)>& body) {
  asio::io_context ctx;
  std::exception_ptr failed;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        store::tcp_store_options o;
        o.host = "127.0.0.1";
        o.port = port;
        auto s = co_await store::tcp_store::connect(ctx.get_executor(), o);
        co_await body(s);
      },
      [&](std::exception_ptr e) { failed = e; });
  ctx.run();
  if (failed)
    std::rethrow_exception(failed);
  return 0;
}

void write_line(int fd, const std::string& s) {
  auto line = s + "\n";
  if (::write(fd, line.data(), line.size()) < 0)
    std::perror("ft suite: write");
}

std::vector<double> numbers_after(const std::string& text, const std::string& tag) {
  std::vector<double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string t;
    double v = 0;
    if (l >> t >> v && t == tag)
      out.push_back(v);
  }
  return out;
}

// ---- quorum_healthy --------------------------------------------------------

void quorum_healthy(context& ctx) {
  const int replicas = 4, steps = ctx.quick ? 50 : 400;
  store_host host;
  auto text = run_forked("ft suite (quorum)", replicas, [&](int r, int out) {
    return run_replica(host.port(), [&](std::shared_ptr<store::store> s) -> asio::awaitable<void> {
      ft::manager_options o;
      o.replica_id = "q" + std::to_string(r);
      o.min_replicas = replicas;
      auto mgr = co_await ft::manager::create(s, o);
      for (int i = 0; i < steps + 5; ++i) {
        auto t0 = clock_type::now();
        co_await mgr->start_step();
        co_await mgr->should_commit(true);
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
        if (i >= 5) // the first steps form the group
          write_line(out, fmt::format("S {}", ns));
      }
    });
  }, std::chrono::minutes(5));
  latency_recorder lat;
  for (double ns : numbers_after(text, "S")) lat.add(std::chrono::nanoseconds(static_cast<std::int64_t>(ns)));
  if (lat.size() == 0)
    throw std::runtime_error("ft suite: the quorum case measured nothing");
  record rec;
  rec.suite = "ft";
  rec.name = "quorum_healthy";
  rec.p50_us = lat.percentile(0.5);
  rec.p99_us = lat.percentile(0.99);
  rec.extra = {{"replicas", replicas},
               {"pct_of_100ms_step_p50", rec.p50_us / 100000.0 * 100.0},
               {"pct_of_100ms_step_p99", rec.p99_us / 100000.0 * 100.0}};
  ctx.report(std::move(rec));
}

// ---- kill9_to_commit -------------------------------------------------------

/// A process with its stdout on a pipe, read line by line.
struct child {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;

  child(const std::vector<std::string>& argv, std::vector<std::pair<std::string, std::string>> env) {
    int p[2];
    if (::pipe(p) != 0)
      throw std::runtime_error("ft suite: pipe failed");
    tools::spawn_options o;
    o.argv = argv;
    o.env = std::move(env);
    o.stdout_fd = p[1];
    o.die_with_parent = true;
    pid = tools::spawn(o);
    ::close(p[1]);
    fd = p[0];
  }
  ~child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    if (fd >= 0)
      ::close(fd);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  /// The next line, or nullopt at the end of output or the deadline.
  std::optional<std::string> line(clock_type::time_point deadline) {
    for (;;) {
      if (auto nl = buf.find('\n'); nl != std::string::npos) {
        auto l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
      if (left <= 0)
        return std::nullopt;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long>(left, 200))) <= 0)
        continue;
      char chunk[4096];
      auto n = ::read(fd, chunk, sizeof chunk);
      if (n <= 0)
        return std::nullopt;
      buf.append(chunk, static_cast<std::size_t>(n));
    }
  }

  /// Reads lines until one starts with `prefix` and `pred` holds for it; returns when it came.
  clock_type::time_point await(const std::string& prefix, const std::function<bool(const std::string&)>& pred,
                               clock_type::time_point deadline) {
    while (auto l = line(deadline))
      if (l->rfind(prefix, 0) == 0 && pred(*l))
        return clock_type::now();
    throw std::runtime_error("ft suite: a replica never printed '" + prefix + "...'");
  }
};

/// One run: 4 replicas, kill -9 of r1 after step 10; seconds to r0's next commit without it.
double kill9_once(const std::string& program) {
  store_host host;
  std::vector<std::unique_ptr<child>> rs;
  for (int i = 0; i < 4; ++i)
    rs.push_back(std::make_unique<child>(
        std::vector<std::string>{program, "--replica", "r" + std::to_string(i), "--steps", "1000000",
                                 "--min-replicas", "3", "--initial-replicas", "4", "--step-ms", "20"},
        std::vector<std::pair<std::string, std::string>>{{"MASTER_ADDR", "127.0.0.1"},
                                                         {"MASTER_PORT", std::to_string(host.port())},
                                                         {"CORODIST_PEER_TIMEOUT_MS", std::to_string(peer_timeout_ms)}}));
  const auto deadline = clock_type::now() + std::chrono::seconds(120);
  rs[0]->await("committed 10 ", [](const std::string&) { return true; }, deadline);
  const auto killed = clock_type::now();
  ::kill(rs[1]->pid, SIGKILL);
  const auto next = rs[0]->await(
      "committed ", [](const std::string& l) { return l.find("r1") == std::string::npos; }, deadline);
  return std::chrono::duration<double>(next - killed).count();
}

void kill9_to_commit(context& ctx) {
  const int runs = ctx.quick ? 1 : 5;
  const auto program = built_program("examples/corodist-ft-train");
  if (program.empty())
    throw std::runtime_error("ft suite: examples/corodist-ft-train is not built");
  latency_recorder lat;
  for (int i = 0; i < runs; ++i) lat.add_us(kill9_once(program) * 1e6);
  record rec;
  rec.suite = "ft";
  rec.name = "kill9_to_commit";
  rec.kind = kind_error_path;
  rec.p50_us = lat.percentile(0.5);
  rec.p99_us = lat.percentile(1.0);
  rec.extra = {{"replicas", 4}, {"runs", runs}, {"deadline_ms", peer_timeout_ms},
               {"target_us", (peer_timeout_ms + 200) * 1000.0}};
  const auto script = bench_script("torch_elastic_peer.py");
  if (!ctx.peers) {
    rec.peers = {peer_result::missing("torchrun", "skipped")};
  } else if (auto why = torch_unavailable()) {
    rec.peers = {peer_result::missing("torchrun", *why)};
  } else if (script.empty()) {
    rec.peers = {peer_result::missing("torchrun", "bench/torch_elastic_peer.py not found")};
  } else {
    auto out = run_peer(ctx, "torchrun 1.13, kill -9 of a worker",
                        {python, script, "--ranks", "4", "--runs", std::to_string(ctx.quick ? 1 : 3)},
                        std::chrono::seconds(600));
    std::vector<double> s;
    for (const auto& l : out.lines)
      if (l.string("case") == "kill9_to_step")
        s.push_back(l.number("seconds"));
    if (s.empty()) {
      rec.peers = {peer_result::missing("torchrun", out.failure.empty() ? "no result" : out.failure)};
    } else {
      std::sort(s.begin(), s.end());
      peer_result p;
      p.name = "torchrun";
      p.p50_us = s[s.size() / 2] * 1e6;
      p.note = "restarts every worker (--max-restarts, monitor_interval 0.5 s)";
      rec.peers = {p};
    }
  }
  ctx.report(std::move(rec));
}

// ---- recover_<size> ---------------------------------------------------------

/// Replicas a and b train; once they are past step 3, c joins and receives the state.
double recover_once(std::size_t bytes, std::uint16_t port, int run) {
  const std::string prefix = fmt::format("bench/ft/recover{}", run);
  auto text = run_forked("ft suite (recovery)", 3, [&](int r, int out) {
    return run_replica(port, [&](std::shared_ptr<store::store> s) -> asio::awaitable<void> {
      ft::manager_options o;
      o.replica_id = std::string(1, static_cast<char>('a' + r));
      o.prefix = prefix;
      o.min_replicas = 2;
      o.quorum_timeout = std::chrono::minutes(2);
      std::vector<float> state(bytes / sizeof(float), static_cast<float>(r));
      if (r == 2) { // the joiner
        std::vector<std::string> ready{prefix + "/ready"};
        co_await s->wait(std::move(ready));
        auto t0 = clock_type::now();
        auto mgr = co_await ft::manager::create(s, o);
        mgr->register_state("state", state);
        auto q = co_await mgr->start_step();
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
        if (!q.recovered || state.front() != 0.0f || state.back() != 0.0f)
          throw std::runtime_error("ft suite: the joiner did not receive the state");
        co_await mgr->should_commit(true);
        write_line(out, fmt::format("R {}", ns));
        co_await s->set(prefix + "/joined", "1");
        co_return;
      }
      auto mgr = co_await ft::manager::create(s, o);
      mgr->register_state("state", state);
      asio::steady_timer pace(co_await asio::this_coro::executor);
      for (;;) {
        auto q = co_await mgr->start_step();
        co_await mgr->should_commit(true);
        if (q.size() == 3)
          break;
        if (mgr->step() == 3 && r == 0)
          co_await s->set(prefix + "/ready", "1");
        pace.expires_after(std::chrono::milliseconds(5));
        co_await pace.async_wait(asio::use_awaitable);
      }
      std::vector<std::string> joined{prefix + "/joined"};
      co_await s->wait(std::move(joined));
    });
  }, std::chrono::minutes(5));
  auto r = numbers_after(text, "R");
  if (r.empty())
    throw std::runtime_error("ft suite: the recovery case measured nothing");
  return r.front() / 1e3; // µs
}

void recover(context& ctx, std::size_t bytes, const char* name) {
  const int runs = ctx.quick ? 1 : 3;
  store_host host;
  latency_recorder lat;
  for (int i = 0; i < runs; ++i) lat.add_us(recover_once(bytes, host.port(), i));
  record rec;
  rec.suite = "ft";
  rec.name = name;
  rec.p50_us = lat.percentile(0.5);
  rec.p99_us = lat.percentile(1.0);
  rec.gbytes_per_s = static_cast<double>(bytes) / (rec.p50_us * 1e-6) / 1e9;
  rec.extra = {{"state_bytes", static_cast<double>(bytes)}, {"runs", runs}};
  ctx.report(std::move(rec));
}

void run_ft_suite(context& ctx) {
  quorum_healthy(ctx);
  kill9_to_commit(ctx);
  recover(ctx, std::size_t{100} << 20, "recover_100MiB");
  recover(ctx, std::size_t{1} << 30, "recover_1GiB");
}

const suite_registrar registrar("ft", &run_ft_suite, 70, 4);

} // namespace
} // namespace corodist::bench
