// Suite "ft": what fault tolerance costs and how fast it acts.
//   quorum_healthy      ft::manager's start_step + should_commit in a step where
//                       nothing changes (4 replica processes), and its share
//                       of a 100 ms step;
//   kill9_to_commit     examples/ft_train.cpp with 4 replicas: from the kill -9
//                       of one to the survivors' next committed step; peer:
//                       torchrun 1.13 (--max-restarts) + DDP on gloo, from the
//                       kill -9 of a worker to the first step after the restart;
//   recover_<size>      a joining replica's start_step that receives 100 MiB /
//                       1 GiB of state from a healthy one (2 + 1 replicas);
//   detect_<fault>_<layer>
//                       failure detection: the time from
//                       a fault to the first error on a survivor, with the
//                       detection deadline D = 1000 ms (CORODIST_PEER_TIMEOUT_MS
//                       in every process), p50/p99 over runs (quick: 1, full: 3),
//                       the error's type in the row ("error", JSON: also
//                       "error_what"). Every process runs on a host of a host
//                       bed (tests/support/host_bed.hpp: network namespaces;
//                       needs root, else these cases print one line saying why
//                       and report nothing). Faults, injected by this process:
//                         kill9      SIGKILL of the process (its kernel closes
//                                    its connections)
//                         sigstop    SIGSTOP of the process (it hangs, its
//                                    connections stay open)
//                         link_down  its host's link down (a silent partition)
//                         block_out  its host's outgoing traffic dropped (an
//                                    asymmetric partition)
//                       Layers (host 0 holds a store_server in each):
//                         store      a client on host 1 blocked in a store
//                                    wait on a key that never comes; the fault
//                                    hits the server (its process, host 0);
//                                    until the wait throws (connection_error);
//                         rpc        agents w0 (host 1) and w1 (host 2) meet at
//                                    the store; w0 has an rpc_async pending to a
//                                    function of w1 that sleeps; the fault hits
//                                    w1; until w0's future fails
//                                    (peer_lost_error);
//                         collective a 3-rank gloo_group on hosts 1..3; ranks
//                                    0 and 1 start an allreduce that rank 2
//                                    never joins; the fault hits rank 2; until
//                                    rank 0's work fails (rank_lost_error; the
//                                    group's own deadline, 120 s, and its
//                                    mismatch probe are out of the way).
//                       This process takes steady_clock::now() right before it
//                       injects the fault; the survivor writes the time of its
//                       error (CLOCK_MONOTONIC, shared by every process of the
//                       machine) to a pipe: detection = that time - the fault's.
//                       A run that fails (no error within 30 s, a bed that
//                       cannot be made) gives a row of "-" with
//                       error="none: the case failed" and the reason in
//                       "error_what" (and on stderr); the suite goes on.
// The replicas' store in the cases above the detection ones is a store_server
// in this process (the launcher's place).
#include "forked_ranks.hpp"
#include "harness.hpp"
#include "store_host.hpp"
#include "peers.hpp"
#include "subprocess.hpp"
#include "support/child_process.hpp"
#include "support/host_bed.hpp"

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/ft/manager.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* python = "/usr/bin/python3";
constexpr int peer_timeout_ms = 1000; // the detection deadline of the runs (CORODIST_PEER_TIMEOUT_MS)


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

/// Reads a pipe's read end line by line, with a deadline.
struct line_reader {
  int fd = -1;
  std::string buf;

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
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return std::nullopt;
      buf.append(chunk, static_cast<std::size_t>(n));
    }
  }
};

/// A process with its stdout on a pipe, read line by line.
struct child {
  pid_t pid = -1;
  line_reader out;

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
    out.fd = p[0];
  }
  ~child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    if (out.fd >= 0)
      ::close(out.fd);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  /// Reads lines until one starts with `prefix` and `pred` holds for it; returns when it came.
  clock_type::time_point await(const std::string& prefix, const std::function<bool(const std::string&)>& pred,
                               clock_type::time_point deadline) {
    while (auto l = out.line(deadline))
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

// ---- detect_<fault>_<layer> -----------------------------------------------

enum class fault { kill9, sigstop, link_down, block_out };
enum class layer { store, rpc, collective };

const char* fault_name(fault f) {
  switch (f) {
  case fault::kill9: return "kill9";
  case fault::sigstop: return "sigstop";
  case fault::link_down: return "link_down";
  case fault::block_out: return "block_out";
  }
  return "?";
}

const char* layer_name(layer l) {
  switch (l) {
  case layer::store: return "store";
  case layer::rpc: return "rpc";
  case layer::collective: return "collective";
  }
  return "?";
}

/// What a survivor saw: how long after the fault its first error came, and the error.
struct detection {
  double us = 0;
  std::string type;
  std::string what;
};

/// Deadlines of the processes' own operations (store waits, rpc calls, the
/// group's collectives): far past D, so that only failure detection ends them.
constexpr auto op_deadline = std::chrono::seconds(120);

std::int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

/// The demangled type name of `e`'s dynamic type.
std::string type_of(const std::exception& e) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? name.get() : typeid(e).name();
}

/// In a survivor: writes "E <who> <monotonic ns> <type> <what>" (one line,
/// atomic on the pipe) and ends the process at once (no teardown that could
/// wait on the lost peer).
[[noreturn]] void report_error_and_exit(int fd, const std::string& who, const std::exception& e) {
  const auto ns = monotonic_ns();
  std::string what = e.what();
  std::replace(what.begin(), what.end(), '\n', ' ');
  if (what.size() > 3000)
    what.resize(3000);
  write_line(fd, fmt::format("E {} {} {} {}", who, ns, type_of(e), what));
  std::fflush(nullptr);
  ::_exit(0);
}

/// In a process of the bed: the detection deadline D for every connection made from here on.
void set_deadline_env() { ::setenv("CORODIST_PEER_TIMEOUT_MS", std::to_string(peer_timeout_ms).c_str(), 1); }

[[noreturn]] void serve_until_killed() {
  for (;;)
    ::pause();
}

std::shared_ptr<store::store> bed_store_client(event_loop& loop, const std::string& address, std::uint16_t port) {
  store::tcp_store_options o;
  o.host = address;
  o.port = port;
  o.auth_token = "";
  o.timeout = op_deadline;
  return store::tcp_store::connect_sync(loop.get_executor(), o);
}

/// The lines the bed's processes write to one pipe, read by this process.
struct bed_pipe {
  int fds[2] = {-1, -1};
  line_reader in;
  bed_pipe() {
    if (::pipe(fds) != 0)
      throw std::runtime_error("ft suite: pipe failed");
    in.fd = fds[0];
  }
  ~bed_pipe() {
    for (int fd : fds)
      if (fd >= 0)
        ::close(fd);
  }
  bed_pipe(const bed_pipe&) = delete;
  bed_pipe& operator=(const bed_pipe&) = delete;
  int write_end() const { return fds[1]; }

  /// Reads lines until one starts with `prefix`; returns it. Throws naming
  /// `what` when none comes by `deadline`.
  std::string expect(const std::string& prefix, const std::string& what, clock_type::time_point deadline) {
    while (auto l = in.line(deadline))
      if (l->rfind(prefix, 0) == 0)
        return *l;
    throw std::runtime_error("ft suite: " + what + ": nothing within the deadline");
  }
};

using bed_processes = std::vector<std::unique_ptr<test::child_process>>;

/// A store_server on host 0 of `bed` (in a process of its own); with
/// `ready_on_wait`, it writes "R server" once one wait is pending there.
/// Returns its port (read from the pipe).
std::uint16_t start_bed_store(const test::host_bed& bed, bed_pipe& pipe, bed_processes& ps, bool ready_on_wait,
                              clock_type::time_point deadline) {
  ps.push_back(bed.run(0, [&pipe, ready_on_wait, address = bed.address(0)]() -> int {
    set_deadline_env();
    event_loop loop;
    loop.start();
    store::server_options so;
    so.host = address;
    so.auth_token = "";
    auto server = store::store_server::start(loop.get_executor(), so);
    write_line(pipe.write_end(), fmt::format("P {}", server->local_endpoint().port()));
    if (ready_on_wait) {
      auto s = server;
      if (!run_blocking(loop.get_executor(), s->wait_until([s] { return s->pending_waits() >= 1; }, op_deadline)))
        return 2;
      write_line(pipe.write_end(), "R server");
    }
    serve_until_killed();
  }));
  const auto line = pipe.expect("P ", "the store server's port", deadline);
  return static_cast<std::uint16_t>(std::stoi(line.substr(2)));
}

/// One run of detect_<f>_<l>: sets up the layer's processes on a fresh bed,
/// injects `f` into the target, and returns what the survivor saw.
detection detect_once(fault f, layer l, int run) {
  const int hosts = l == layer::store ? 2 : l == layer::rpc ? 3 : 4;
  test::host_bed bed(hosts); // before the processes: they end first, then the bed goes
  bed_pipe pipe;
  bed_processes ps;
  const auto deadline = clock_type::now() + std::chrono::seconds(90);
  int target_host = 0;
  pid_t target_pid = -1;
  std::string survivor;
  switch (l) {
  case layer::store: {
    const auto port = start_bed_store(bed, pipe, ps, true, deadline);
    target_host = 0;
    target_pid = ps.back()->pid();
    survivor = "client";
    ps.push_back(bed.run(1, [&pipe, port, address = bed.address(0)]() -> int {
      set_deadline_env();
      event_loop loop;
      loop.start();
      store::sync_store s(bed_store_client(loop, address, port));
      try {
        s.wait({"bench/detect/never"}, op_deadline);
      } catch (const std::exception& e) {
        report_error_and_exit(pipe.write_end(), "client", e);
      }
      return 3; // (the key came)
    }));
    pipe.expect("R server", "the client's wait at the server", deadline);
    break;
  }
  case layer::rpc: {
    const auto port = start_bed_store(bed, pipe, ps, false, deadline);
    auto worker = [&pipe, port, store_address = bed.address(0)](int rank, std::string address) -> int {
      set_deadline_env();
      event_loop loop;
      loop.start();
      rpc::agent_options o;
      o.name = "w" + std::to_string(rank);
      o.rank = rank;
      o.world_size = 2;
      o.store = bed_store_client(loop, store_address, port);
      o.rpc_timeout = op_deadline;
      o.init_timeout = std::chrono::seconds(60);
      o.shutdown_timeout = std::chrono::seconds(5);
      o.auth_token = "";
      o.host = std::move(address);
      rpc::agent a(loop, o);
      const int out = pipe.write_end();
      a.register_function("sleep", [out](int v) {
        write_line(out, "R w1 sleeps");
        std::this_thread::sleep_for(op_deadline); // a long call, pending on w0 when the fault comes
        return v;
      });
      a.start();
      if (rank == 1)
        serve_until_killed();
      auto call = a.rpc_async<int>("w1", "sleep", 1);
      try {
        call.get();
      } catch (const std::exception& e) {
        report_error_and_exit(out, "w0", e);
      }
      return 3; // (the call returned)
    };
    ps.push_back(bed.run(1, [worker, address = bed.address(1)] { return worker(0, address); }));
    ps.push_back(bed.run(2, [worker, address = bed.address(2)] { return worker(1, address); }));
    target_host = 2;
    target_pid = ps.back()->pid();
    survivor = "w0";
    pipe.expect("R w1 sleeps", "w0's call running on w1", deadline);
    break;
  }
  case layer::collective: {
    const auto port = start_bed_store(bed, pipe, ps, false, deadline);
    const std::string prefix = fmt::format("bench/detect/{}/{}", fault_name(f), run);
    for (int rank = 0; rank < 3; ++rank)
      ps.push_back(bed.run(1 + rank, [&pipe, port, rank, prefix, store_address = bed.address(0),
                                      address = bed.address(1 + rank)]() -> int {
        set_deadline_env();
        event_loop loop;
        loop.start();
        auto s = bed_store_client(loop, store_address, port);
        collective::gloo_options o;
        o.prefix = prefix;
        o.host = address;
        o.timeout = op_deadline;
        o.mismatch_probe_delay = std::chrono::milliseconds(0); // (rank 2 never calls: no probe)
        auto pg = collective::gloo_group::create_sync(s, rank, 3, o);
        const auto who = "rank" + std::to_string(rank);
        if (rank == 2) {
          write_line(pipe.write_end(), "R " + who);
          serve_until_killed();
        }
        std::vector<float> v(1024, 1.0f);
        auto w = pg->allreduce(v);
        write_line(pipe.write_end(), "R " + who);
        try {
          w.get();
        } catch (const std::exception& e) {
          report_error_and_exit(pipe.write_end(), who, e);
        }
        return 3; // (the allreduce completed)
      }));
    target_host = 3;
    target_pid = ps.back()->pid();
    survivor = "rank0";
    for (int ready = 0; ready < 3; ++ready)
      pipe.expect("R rank", "the group's ranks (created, allreduce issued)", deadline);
    break;
  }
  }
  const auto fault_ns = monotonic_ns();
  switch (f) {
  case fault::kill9: test::host_bed::kill9(target_pid); break;
  case fault::sigstop: test::host_bed::stop(target_pid); break;
  case fault::link_down: bed.link_down(target_host); break;
  case fault::block_out: bed.block(target_host, test::direction::out); break;
  }
  // The survivor's error: "E <who> <ns> <type> <what>".
  const auto line = pipe.expect("E " + survivor + " ", survivor + "'s error after the fault",
                                clock_type::now() + std::chrono::seconds(30));
  std::istringstream in(line.substr(3 + survivor.size()));
  std::int64_t error_ns = 0;
  detection d;
  in >> error_ns >> d.type;
  std::getline(in >> std::ws, d.what);
  d.us = static_cast<double>(error_ns - fault_ns) / 1e3;
  return d;
}

void detect(context& ctx, fault f, layer l) {
  const auto name = fmt::format("detect_{}_{}", fault_name(f), layer_name(l));
  const int runs = ctx.quick ? 1 : 3;
  record rec;
  rec.suite = "ft";
  rec.name = name;
  rec.kind = kind_error_path;
  rec.extra = {{"deadline_ms", peer_timeout_ms}, {"runs", runs}};
  try {
    latency_recorder lat;
    detection first;
    for (int i = 0; i < runs; ++i) {
      if (ctx.status != nullptr)
        ctx.status->note(fmt::format("{} run {}/{}", name, i + 1, runs));
      auto d = detect_once(f, l, i);
      lat.add_us(d.us);
      if (i == 0)
        first = std::move(d);
    }
    rec.p50_us = lat.percentile(0.5);
    rec.p99_us = lat.percentile(0.99);
    rec.text = {{"error", first.type}, {"error_what", first.what}};
  } catch (const std::exception& e) {
    rec.text = {{"error", "none: the case failed"}, {"error_what", e.what()}};
    fmt::print(stderr, "ft suite: {} failed: {}\n", name, e.what());
  }
  ctx.report(std::move(rec));
}

void detection_cases(context& ctx) {
  if (const auto why = test::host_bed::unavailable_reason(); !why.empty()) {
    fmt::print(ctx.table_out, "# ft: detect_* cases not run: no host test bed: {}\n", why);
    return;
  }
  for (auto l : {layer::store, layer::rpc, layer::collective}) {
    if (l == layer::collective && !collective::gloo_group::built()) {
      fmt::print(ctx.table_out, "# ft: detect_*_collective cases not run: this build has no Gloo\n");
      continue;
    }
    for (auto f : {fault::kill9, fault::sigstop, fault::link_down, fault::block_out})
      detect(ctx, f, l);
  }
}

void run_ft_suite(context& ctx) {
  quorum_healthy(ctx);
  kill9_to_commit(ctx);
  recover(ctx, std::size_t{100} << 20, "recover_100MiB");
  recover(ctx, std::size_t{1} << 30, "recover_1GiB");
  detection_cases(ctx);
}

const suite_registrar registrar("ft", &run_ft_suite, 70, 4 + 4 * 3);

} // namespace
} // namespace corodist::bench
