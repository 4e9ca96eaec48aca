/// \file
/// Suite `store`: store_server + tcp_store over loopback. Server and clients
/// run on two event-loop threads (the raw floor's two-thread shape); the
/// memory case runs the standalone `corodist-store serve` daemon as its own
/// process and reads its resident memory.

#include "closed_loop.hpp"
#include "harness.hpp"
#include "peers.hpp"
#include "process_resources.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/store/file_store.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <poll.h>
#include <spawn.h>
#include <thread>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace corodist::bench {
namespace {

namespace cs = corodist::store;
using clock_type = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

cs::tcp_store_options client_options(std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = std::chrono::seconds(60);
  return o;
}

struct server_and_client {
  server_and_client() {
    server_loop.start();
    client_loop.start();
    cs::server_options so;
    so.auth_token = "";
    server = cs::store_server::start(server_loop.get_executor(), so);
    port = server->local_endpoint().port();
  }
  ~server_and_client() {
    server.reset();
    client_loop.stop();
    server_loop.stop();
  }
  event_loop server_loop;
  event_loop client_loop;
  std::shared_ptr<cs::store_server> server;
  std::uint16_t port = 0;
};

/// PyTorch's TCPStore client (python3-torch 1.13) against its own master and
/// against `port` (our server), as a child process with our pinning.
peer_output torch_store_peer(context& ctx, std::uint16_t port) {
  if (!ctx.peers) return {{}, "skipped"};
  if (auto why = torch_unavailable()) return {{}, *why};
  const auto script = bench_script("torch_store_peer.py");
  if (script.empty()) return {{}, "not installed"};
  return run_peer(ctx, "PyTorch TCPStore", {"/usr/bin/python3", script, "--json", "--port", std::to_string(port),
                                             "--clients", "64", "--samples", ctx.quick ? "2000" : "20000",
                                             "--adds", ctx.quick ? "500" : "2000"},
                  std::chrono::seconds(600));
}

/// The case's peers: PyTorch's client against its own master, and against our server.
std::vector<peer_result> torch_store_peers(const peer_output& torch, const std::string& op, const char* p50_key,
                                           const char* ops_key) {
  return {peer_from("pytorch", torch, {{"master", "pytorch"}, {"op", op}}, p50_key, ops_key),
          peer_from("pytorch-client@corodist", torch, {{"master", "corodist"}, {"op", op}}, p50_key, ops_key)};
}

void single_client(context& ctx, server_and_client& env, const peer_output& torch) {
  const std::size_t samples = ctx.quick ? 10'000 : 100'000;
  const double budget_s = ctx.quick ? 3.0 : 20.0;
  auto ex = asio::any_io_executor(env.client_loop.get_executor());
  auto store = run_blocking(ex, cs::tcp_store::connect(ex, client_options(env.port)));
  struct op_case {
    const char* name;
    int which;
  };
  for (op_case oc : {op_case{"get", 0}, op_case{"set", 1}, op_case{"add", 2}, op_case{"compare_set", 3}}) {
    auto [lat, elapsed] = run_blocking(ex, [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
      co_await store->set("bench/key", "0123456789abcdef");
      auto one = [&]() -> asio::awaitable<void> {
        switch (oc.which) {
        case 0: (void)co_await store->get("bench/key"); break;
        case 1: co_await store->set("bench/key", "0123456789abcdef"); break;
        case 2: (void)co_await store->add("bench/counter", 1); break;
        default: (void)co_await store->compare_set("bench/key", "0123456789abcdef", "0123456789abcdef"); break;
        }
      };
      for (std::size_t i = 0; i < samples / 10; ++i)
        co_await one();
      latency_recorder rec(samples);
      const auto start = clock_type::now();
      for (std::size_t i = 0; i < samples; ++i) {
        const auto t0 = clock_type::now();
        co_await one();
        const auto t1 = clock_type::now();
        rec.add(t1 - t0);
        if (std::chrono::duration<double>(t1 - start).count() > budget_s)
          break;
      }
      co_return std::pair{std::move(rec), seconds_since(start)};
    }());
    auto r = latency_record("store", oc.name, lat, elapsed);
    if (oc.which != 3) // PyTorch 1.13's Python TCPStore has no compare_set
      r.peers = torch_store_peers(torch, oc.name, "p50_us", nullptr);
    if (oc.which == 1) // our set is a round trip; PyTorch 1.13's returns once sent
      for (auto& p : r.peers) {
        p.comparable = false;
        p.note = "one-way: PyTorch 1.13's set returns without a reply";
      }
    ctx.report(std::move(r));
  }
}

void concurrent_clients(context& ctx, server_and_client& env, const peer_output& torch) {
  constexpr int clients = 64;
  const std::size_t total = ctx.quick ? 200'000 : 1'000'000;
  auto ex = asio::any_io_executor(env.client_loop.get_executor());
  auto [lat, elapsed] = run_blocking(ex, [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
    std::vector<std::shared_ptr<cs::tcp_store>> stores;
    for (int i = 0; i < clients; ++i)
      stores.push_back(co_await cs::tcp_store::connect(ex, client_options(env.port)));
    auto one_add = [&stores](int c) -> asio::awaitable<void> { (void)co_await stores[c]->add("bench/agg", 1); };
    co_return co_await run_closed_loop(ex, clients, total, one_add);
  }());
  // The same shape on bare sockets, measured right after (the VM's wake-up mode drifts):
  // the most any implementation could do here.
  const auto floor = raw_fanin(clients, 64, total);
  auto r = latency_record("store", "add_64_clients", lat, elapsed);
  r.extra = {{"clients", double(clients)},
             {"ops", static_cast<double>(lat.size())},
             {"raw_fanin_ops_per_s", floor.ops_per_s},
             {"of_raw_fanin", r.ops_per_s / floor.ops_per_s}};
  r.peers = torch_store_peers(torch, "add_64_clients", nullptr, "ops_per_s");
  ctx.report(std::move(r));
}

std::string self_dir() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    throw std::runtime_error("cannot read /proc/self/exe");
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/'));
}

/// A standalone `corodist-store serve` process (no token, a port of its own),
/// killed and reaped when this goes.
struct store_daemon {
  /// `overrides`: "NAME=VALUE" entries of the daemon's environment in place
  /// of this process's.
  explicit store_daemon(const std::vector<std::string>& overrides = {}) {
    const std::string daemon = self_dir() + "/../tools/corodist-store";
    std::vector<std::string> env_text;
    auto overridden = [&](std::string_view e) {
      for (const auto& o : overrides)
        if (e.starts_with(o.substr(0, o.find('=') + 1)))
          return true;
      return false;
    };
    for (char** e = environ; *e != nullptr; ++e)
      if (!overridden(*e))
        env_text.emplace_back(*e);
    env_text.insert(env_text.end(), overrides.begin(), overrides.end());
    std::vector<char*> envp;
    for (auto& e : env_text)
      envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2];
    if (::pipe(out) != 0)
      throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    const char* argv[] = {daemon.c_str(), "--port", "0", "--auth-token", "", "serve", nullptr};
    if (posix_spawn(&pid, daemon.c_str(), &fa, nullptr, const_cast<char**>(argv), envp.data()) != 0)
      throw std::runtime_error("cannot start " + daemon);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    f = ::fdopen(out[0], "r");
    char line[256] = {};
    unsigned p = 0;
    if (!std::fgets(line, sizeof line, f) || std::sscanf(std::strrchr(line, ':'), ":%u", &p) != 1) {
      stop(SIGKILL);
      throw std::runtime_error("corodist-store serve did not report its port");
    }
    port = static_cast<std::uint16_t>(p);
  }
  ~store_daemon() { stop(SIGKILL); }
  store_daemon(const store_daemon&) = delete;
  store_daemon& operator=(const store_daemon&) = delete;

  /// Sends `sig` and reaps the process (once).
  void stop(int sig) {
    if (pid > 0) {
      ::kill(pid, sig);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (f) {
      std::fclose(f);
      f = nullptr;
    }
  }

  pid_t pid = -1;
  std::uint16_t port = 0;
  FILE* f = nullptr;
};

void memory_per_connection(context& ctx) {
  const int conns = ctx.quick ? 2000 : 10000;
  store_daemon server;
  const pid_t pid = server.pid;
  event_loop loop;
  loop.start();
  auto ex = asio::any_io_executor(loop.get_executor());
  auto opts = client_options(server.port);
  std::vector<std::shared_ptr<cs::tcp_store>> stores;
  long before = 0, after = 0;
  double idle_cpu_pct = not_applicable;
  const auto idle_window = ctx.quick ? std::chrono::seconds(3) : std::chrono::seconds(10);
  try {
    // One warm client first, so the baseline includes the server's first-use allocations.
    stores.push_back(run_blocking(ex, cs::tcp_store::connect(ex, opts)));
    run_blocking(ex, stores[0]->set("mem/warm", "1"));
    std::this_thread::sleep_for(ms(200));
    before = resident_bytes(pid);
    for (int i = 0; i < conns; i += 256) {
      auto batch = run_blocking(ex, [&]() -> asio::awaitable<std::vector<std::shared_ptr<cs::tcp_store>>> {
        std::vector<std::shared_ptr<cs::tcp_store>> made;
        for (int j = i; j < std::min(conns, i + 256); ++j) {
          auto s = co_await cs::tcp_store::connect(ex, opts);
          std::vector<std::string> keys{"mem/warm"};
          (void)co_await s->check(std::move(keys)); // fully served once
          made.push_back(std::move(s));
        }
        co_return made;
      }());
      stores.insert(stores.end(), batch.begin(), batch.end());
    }
    std::this_thread::sleep_for(ms(500));
    after = resident_bytes(pid);
    // The heartbeat load: the server's CPU while every connection is idle
    // (each side sends a heartbeat after a quarter of peer_timeout without output).
    const double cpu0 = cpu_seconds(pid);
    const auto t0 = clock_type::now();
    std::this_thread::sleep_for(idle_window);
    idle_cpu_pct = (cpu_seconds(pid) - cpu0) / std::chrono::duration<double>(clock_type::now() - t0).count() * 100.0;
  } catch (...) {
    server.stop(SIGKILL);
    throw;
  }
  stores.clear();
  loop.stop();
  server.stop(SIGTERM);
  record r;
  r.suite = "store";
  r.name = fmt::format("idle_connections_{}", conns);
  r.extra = {{"bytes_per_conn", double(after - before) / conns},
             {"connections", double(conns)},
             {"server_rss_before", double(before)},
             {"server_rss_after", double(after)},
             {"server_idle_cpu_pct", idle_cpu_pct},
             {"idle_window_s", std::chrono::duration<double>(idle_window).count()},
             {"peer_timeout_ms", double(corodist::net::configured_peer_timeout().length().count())}};
  ctx.report(std::move(r));
}

// ---- rendezvous: one `corodist-store serve`, ranks in forked client processes

/// Ranks one client process serves at most: its descriptors stay well under a
/// process's limit, and its connections under its source address's ports.
constexpr int ranks_per_client_process = 12000;
/// Connects one client process has in flight at once (the server's listen
/// backlog, somaxconn, is shared by all of them).
constexpr int connects_in_flight = 400;
/// How long a case may take, from its release to the last rank through.
constexpr auto rendezvous_deadline = std::chrono::seconds(300);
/// Descriptors the server keeps besides its connections (listener, event loop, logs).
constexpr rlim_t server_fd_headroom = 64;

/// The client processes of a `ranks`-rank case: one per 12,000 ranks, at least two from 4,096.
int client_processes(int ranks) {
  const int p = (ranks + ranks_per_client_process - 1) / ranks_per_client_process;
  return std::max(p, ranks >= 4096 ? 2 : 1);
}

/// The ranks of one client process and their shared state (on its event loop).
struct rank_group {
  rank_group(asio::any_io_executor executor, cs::tcp_store_options o, int first_rank, int ranks, int world_size)
      : ex(executor), opts(std::move(o)), first(first_rank), count(ranks), world(world_size),
        done(executor, clock_type::time_point::max()), slot(executor, clock_type::time_point::max()),
        give_up(clock_type::now() + rendezvous_deadline), stores(static_cast<std::size_t>(ranks)) {}

  asio::any_io_executor ex;
  cs::tcp_store_options opts;
  int first, count, world;
  int finished = 0, connecting = 0;
  std::exception_ptr failure;
  asio::steady_timer done; ///< cancelled when all ranks are through, or one failed
  asio::steady_timer slot; ///< cancelled when a connect completes
  clock_type::time_point give_up;
  std::vector<std::shared_ptr<cs::tcp_store>> stores; ///< each rank's store, kept connected
};

/// What rank `g.first + i` does at init: connect, add itself to
/// "rdzv/arrived", set "rdzv/rank/<r>"; the rank whose add returns the world
/// size sets "rdzv/done"; all wait on "rdzv/done".
asio::awaitable<void> rank_body(std::shared_ptr<rank_group> g, int i) {
  const int r = g->first + i;
  try {
    auto s = co_await cs::tcp_store::connect(g->ex, g->opts);
    --g->connecting;
    g->slot.cancel_one();
    const auto n = co_await s->add("rdzv/arrived", 1);
    co_await s->set(fmt::format("rdzv/rank/{}", r), fmt::format("pid {}", ::getpid()));
    if (n == g->world)
      co_await s->set("rdzv/done", "1");
    // One wait to the case's deadline. (Waits renewed every 4 s, as earlier
    // runs did, cost 98,304 ranks about 150,000 more round trips; the
    // store's log of long waits says one line per client process instead.)
    std::vector<std::string> keys{"rdzv/done"};
    co_await s->wait(std::move(keys), std::max(ms(1), std::chrono::ceil<ms>(g->give_up - clock_type::now()))); // (0: forever)
    g->stores[static_cast<std::size_t>(i)] = std::move(s);
  } catch (...) {
    if (!g->failure)
      g->failure = std::current_exception();
    g->slot.cancel();
    g->done.cancel();
  }
  if (++g->finished == g->count)
    g->done.cancel();
}

/// Runs the ranks of `g` (at most `connects_in_flight` connecting at once)
/// until all are through the barrier; throws the first rank's error.
asio::awaitable<void> run_ranks(std::shared_ptr<rank_group> g) {
  for (int next = 0; next < g->count && !g->failure;) {
    if (g->connecting >= connects_in_flight) {
      co_await g->slot.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      continue;
    }
    ++g->connecting;
    asio::co_spawn(g->ex, rank_body(g, next++), asio::detached);
  }
  while (g->finished < g->count && !g->failure)
    co_await g->done.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  if (g->failure)
    std::rethrow_exception(g->failure);
}

/// Writes `line` to `fd` in one write (lines are shorter than PIPE_BUF).
void say(int fd, const std::string& line) { (void)!::write(fd, line.data(), line.size()); }

/// Ends this process at once, its event loop still running: its connections close with it.
[[noreturn]] void leave_process(int rc) {
  std::fflush(nullptr);
  ::_exit(rc);
}

/// One client process of a rendezvous case, after the fork: says "ready",
/// waits for the release (EOF on `go_fd`), runs ranks [first, first + count)
/// from source address 127.0.0.(2 + index), says "ok <seconds>" (or "error
/// <what>"), keeps its connections until EOF on `quit_fd`, and exits.
/// The heartbeat deadline of the rendezvous (server and ranks): each side of a
/// connection sends a heartbeat after a quarter of it without output, and
/// with the default 10 s, 98,304 ranks (about 45,000 heartbeats a second each
/// way) starve this 2-vCPU machine, and connects time out. A job of that size
/// would set it so (CORODIST_PEER_TIMEOUT_MS); PyTorch's TCPStore has none.
constexpr std::chrono::milliseconds rendezvous_peer_timeout{60'000};
const std::string rendezvous_peer_timeout_env =
    "CORODIST_PEER_TIMEOUT_MS=" + std::to_string(rendezvous_peer_timeout.count());

[[noreturn]] void rendezvous_client(int index, int first, int count, int world, std::uint16_t port, int go_fd,
                                    int quit_fd, int out_fd) {
  auto failed = [out_fd, index](const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    say(out_fd, fmt::format("error {} {}\n", index, what.substr(0, 1000)));
    leave_process(1);
  };
  try {
    raise_fd_limit();
    ::setenv("CORODIST_PEER_TIMEOUT_MS", std::to_string(rendezvous_peer_timeout.count()).c_str(), 1);
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    auto opts = client_options(port);
    opts.source_address = fmt::format("127.0.0.{}", 2 + index);
    auto g = std::make_shared<rank_group>(ex, opts, first, count, world);
    say(out_fd, fmt::format("ready {}\n", index));
    char c = 0;
    while (::read(go_fd, &c, 1) < 0 && errno == EINTR) {
    }
    const auto t0 = clock_type::now();
    try {
      run_blocking(ex, run_ranks(g));
    } catch (const std::exception& e) {
      failed(e); // with the ranks' connections as they are
    }
    say(out_fd, fmt::format("ok {} {:.6f}\n", index, seconds_since(t0)));
    while (::read(quit_fd, &c, 1) < 0 && errno == EINTR) {
    }
    leave_process(0);
  } catch (const std::exception& e) {
    failed(e);
  }
  leave_process(1);
}

/// Reads the lines the client processes write to one pipe.
class line_reader {
public:
  explicit line_reader(int fd) : fd_(fd) {}

  /// The next line (without its newline), or nullopt at EOF or once `deadline` has passed.
  std::optional<std::string> next(clock_type::time_point deadline) {
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        auto line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<ms>(deadline - clock_type::now()).count();
      if (left <= 0)
        return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long>(left, 1000))) <= 0)
        continue;
      char chunk[4096];
      const auto got = ::read(fd_, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        return std::nullopt;
      buf_.append(chunk, static_cast<std::size_t>(got));
    }
  }

private:
  int fd_;
  std::string buf_;
};

/// The 1,024-rank case's figures, which the larger cases' growth is relative to.
struct rendezvous_reference {
  double seconds_per_rank = not_applicable;
  double rss_per_conn = not_applicable;
  double cpu_per_rank = not_applicable;
};

/// One rendezvous case: a fresh `corodist-store serve`, `ranks` ranks in
/// client_processes(ranks) forked processes released together; the server's
/// resident memory, CPU time and the listen drops over the rendezvous.
record rendezvous_case(context& ctx, int ranks, rendezvous_reference& ref) {
  record r;
  r.suite = "store";
  r.name = fmt::format("rendezvous_{}_ranks", ranks);
  r.extra = {{"ranks", double(ranks)}};
  // On Asio's sockets the server holds one descriptor per rank: where the hard
  // limit is lower, the server runs on the uring transport (its connections
  // then hold none), and where that cannot run either, the case cannot run.
  const rlim_t hard = fd_hard_limit();
  const rlim_t needed = static_cast<rlim_t>(ranks) + server_fd_headroom;
  std::string transport = "asio";
  if (const char* t = std::getenv("CORODIST_NET_TRANSPORT"); t != nullptr && std::string_view(t) == "uring")
    transport = "uring";
  if (hard != RLIM_INFINITY && needed > hard) {
    r.extra.emplace_back("descriptors_needed", double(needed));
    r.extra.emplace_back("rlimit_nofile_hard", double(hard));
    const std::string why = corodist::net::uring_unavailable_reason();
    if (!why.empty()) {
      r.text = {{"error", fmt::format("not runnable here: the server needs {} descriptors, RLIMIT_NOFILE hard limit is "
                                      "{} (raising it needs CAP_SYS_RESOURCE), and the uring transport cannot run: {}",
                                      needed, hard, why)}};
      return r;
    }
    transport = "uring";
  }
  r.text.emplace_back("server_transport", transport);
  r.extra.emplace_back("peer_timeout_ms", double(rendezvous_peer_timeout.count()));
  if (ctx.status != nullptr)
    ctx.status->note(fmt::format("rendezvous of {} ranks", ranks));
  const int procs = client_processes(ranks);
  store_daemon server({"CORODIST_NET_TRANSPORT=" + transport, rendezvous_peer_timeout_env});
  // (it inherits the raised descriptor limit: max_connections follows it)
  const pid_t spid = server.pid;
  { // one client first, so the baseline includes the server's first-use allocations
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    auto s = run_blocking(ex, cs::tcp_store::connect(ex, client_options(server.port)));
    run_blocking(ex, s->set("rdzv/warm", "1"));
    s.reset();
    loop.stop(); // no thread of ours runs while the clients are forked
  }
  int go[2], quit[2], out[2];
  if (::pipe(go) != 0 || ::pipe(quit) != 0 || ::pipe(out) != 0)
    throw std::runtime_error("rendezvous: pipe failed");
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < procs; ++i) {
    const int first = static_cast<int>(static_cast<long>(ranks) * i / procs);
    const int last = static_cast<int>(static_cast<long>(ranks) * (i + 1) / procs);
    const pid_t pid = ::fork();
    if (pid < 0)
      break; // reported below as a failure
    if (pid == 0) {
      ::close(go[1]);
      ::close(quit[1]);
      ::close(out[0]);
      rendezvous_client(i, first, last - first, ranks, server.port, go[0], quit[0], out[1]);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(quit[0]);
  ::close(out[1]);
  line_reader lines(out[0]);
  std::string failure = static_cast<int>(pids.size()) < procs ? "fork failed" : "";
  // Every process has its event loop running before the release.
  const auto ready_by = clock_type::now() + std::chrono::seconds(60);
  for (int ready = 0; failure.empty() && ready < procs;) {
    auto l = lines.next(ready_by);
    if (!l)
      failure = "the client processes did not all start";
    else if (l->starts_with("ready "))
      ++ready;
    else if (l->starts_with("error "))
      failure = *l;
  }
  long rss_before = 0, rss_after = 0, drops_before = 0, drops_after = 0, overflows_before = 0, overflows_after = 0;
  double cpu_before = 0, cpu_after = 0, elapsed = 0, slowest_client = 0;
  try {
    std::this_thread::sleep_for(ms(200));
    rss_before = resident_bytes(spid);
    cpu_before = cpu_seconds(spid);
    drops_before = tcp_ext_counter("ListenDrops");
    overflows_before = tcp_ext_counter("ListenOverflows");
    const auto start = clock_type::now();
    ::close(go[1]); // EOF: all released together
    go[1] = -1;
    for (int through = 0; failure.empty() && through < procs;) {
      auto l = lines.next(start + rendezvous_deadline + std::chrono::seconds(10));
      if (!l) {
        failure = fmt::format("{} of {} client processes through after {:.0f} s", through, procs, seconds_since(start));
      } else if (l->starts_with("ok ")) {
        ++through;
        elapsed = seconds_since(start);
        int idx = 0;
        double s = 0;
        if (std::sscanf(l->c_str(), "ok %d %lf", &idx, &s) == 2)
          slowest_client = std::max(slowest_client, s);
      } else if (l->starts_with("error ")) {
        failure = *l;
      }
    }
    // All connected and through the barrier: the server's figures now.
    rss_after = resident_bytes(spid);
    cpu_after = cpu_seconds(spid);
    drops_after = tcp_ext_counter("ListenDrops");
    overflows_after = tcp_ext_counter("ListenOverflows");
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (go[1] >= 0)
    ::close(go[1]);
  ::close(quit[1]); // EOF: the clients exit, their connections close
  for (auto pid : pids) {
    if (!failure.empty())
      ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(out[0]);
  server.stop(failure.empty() ? SIGTERM : SIGKILL);
  r.extra.emplace_back("client_processes", double(procs));
  if (!failure.empty()) {
    r.text = {{"error", "failed: " + failure}};
    return r;
  }
  const double rss_per_conn = double(rss_after - rss_before) / ranks;
  const double cpu_s = cpu_after - cpu_before;
  if (ranks == 1024)
    ref = {elapsed / ranks, rss_per_conn, cpu_s / ranks};
  auto growth = [](double ours, double base) { return base > 0 ? ours / base : not_applicable; };
  r.ops_per_s = ranks / elapsed; // ranks through per second: compared with the peer's
  r.extra.insert(r.extra.begin(), {"rendezvous_s", elapsed});
  r.extra.insert(r.extra.end(),
                 {{"slowest_client_s", slowest_client},
                  {"server_rss_per_conn", rss_per_conn},
                  {"server_rss_before", double(rss_before)},
                  {"server_rss_after", double(rss_after)},
                  {"server_cpu_s", cpu_s},
                  {"cpu_us_per_rank", cpu_s * 1e6 / ranks},
                  {"listen_drops", double(drops_after - drops_before)},
                  {"listen_overflows", double(overflows_after - overflows_before)},
                  {"time_per_rank_vs_1k", growth(elapsed / ranks, ref.seconds_per_rank)},
                  {"rss_per_conn_vs_1k", growth(rss_per_conn, ref.rss_per_conn)},
                  {"cpu_per_rank_vs_1k", growth(cpu_s / ranks, ref.cpu_per_rank)}});
  return r;
}

/// PyTorch 1.13's TCPStore (legacy backend) through the same rendezvous of
/// `ranks` ranks (bench/torch_store_peer.py --rendezvous): its master in the
/// script, the ranks as threads of forked processes. ops_per_s: ranks through
/// per second; a failure (as at sizes it cannot reach) is its status.
/// How long the PyTorch rendezvous may take: beyond its 4K ranks' 11 s here
/// it does not finish (16K ranks need more descriptors and ports than this
/// machine has), and that outcome is recorded by this limit.
constexpr auto peer_rendezvous_limit = std::chrono::seconds(60);

/// Also gives the peer's rendezvous_s and its master's RSS per connection
/// (`extra`, for the scaling plot) when it finished.
peer_result torch_rendezvous_peer(context& ctx, int ranks, std::vector<std::pair<std::string, double>>& extra) {
  if (!ctx.peers)
    return peer_result::missing("pytorch", "skipped");
  if (auto why = torch_unavailable())
    return peer_result::missing("pytorch", *why);
  const auto script = bench_script("torch_store_peer.py");
  if (script.empty())
    return peer_result::missing("pytorch", "not installed");
  const auto out = run_peer(ctx, fmt::format("PyTorch TCPStore rendezvous of {} ranks", ranks),
                            {"/usr/bin/python3", script, "--json", "--rendezvous", std::to_string(ranks)},
                            peer_rendezvous_limit);
  const peer_line* l = out.find({{"op", fmt::format("rendezvous_{}", ranks)}});
  if (l == nullptr)
    return peer_result::missing("pytorch", out.failure.empty() ? "failed: no result" : out.failure);
  if (auto why = l->string("failure"); !why.empty())
    return peer_result::missing("pytorch", "failed: " + why.substr(0, 300));
  peer_result p;
  p.name = "pytorch";
  p.ops_per_s = ranks / l->number("rendezvous_s");
  extra.emplace_back("peer_rendezvous_s", l->number("rendezvous_s"));
  extra.emplace_back("peer_server_rss_per_conn", l->number("server_rss_per_conn"));
  return p;
}

/// The rendezvous cases (1K and 4K with --quick; up to 98K otherwise), then
/// one line on how time, memory and CPU per rank grow from 1K ranks.
void rendezvous_cases(context& ctx) {
  std::vector<int> sizes{1024, 4096};
  if (!ctx.quick)
    sizes.insert(sizes.end(), {16384, 65536, 98304});
  if (const char* only = std::getenv("CORODIST_RENDEZVOUS_RANKS"); only != nullptr && *only) { // e.g. "1024,98304"
    sizes.clear();
    for (const char* p = only; *p;) {
      char* end = nullptr;
      const long n = std::strtol(p, &end, 10);
      if (end == p)
        break;
      if (n > 0)
        sizes.push_back(static_cast<int>(n));
      p = *end == ',' ? end + 1 : end;
    }
  }
  rendezvous_reference ref;
  std::string growth;
  for (int ranks : sizes) {
    record r;
    try {
      r = rendezvous_case(ctx, ranks, ref);
    } catch (const std::exception& e) {
      r = record{};
      r.suite = "store";
      r.name = fmt::format("rendezvous_{}_ranks", ranks);
      r.extra = {{"ranks", double(ranks)}};
      r.text = {{"error", std::string("failed: ") + e.what()}};
    }
    if (ranks <= 16384) // the peer at 1K, 4K and 16K ranks
      r.peers = {torch_rendezvous_peer(ctx, ranks, r.extra)};
    auto value = [&r](const char* key) {
      for (const auto& [k, v] : r.extra)
        if (k == key)
          return v;
      return not_applicable;
    };
    if (ranks != 1024 && !std::isnan(value("time_per_rank_vs_1k")))
      growth += fmt::format("; {}: x{:.2f} time, x{:.2f} RSS, x{:.2f} CPU", ranks, value("time_per_rank_vs_1k"),
                            value("rss_per_conn_vs_1k"), value("cpu_per_rank_vs_1k"));
    ctx.report(std::move(r));
  }
  if (!growth.empty()) {
    if (ctx.status != nullptr)
      ctx.status->pause();
    fmt::print(ctx.table_out, "# store rendezvous per rank against 1024 ranks (1 = linear, < 1 = better){}\n", growth);
    std::fflush(ctx.table_out);
  }
}

/// A record of how long a failure path took (p50/p99 of `rec`, in µs): an
/// error to surface, or a deadline's overrun.
record duration_record(std::string name, const latency_recorder& rec, std::vector<std::pair<std::string, double>> extra) {
  record r;
  r.suite = "store";
  r.name = std::move(name);
  r.p50_us = rec.percentile(0.5);
  r.p99_us = rec.percentile(0.99);
  r.extra = std::move(extra);
  r.extra.emplace_back("samples", static_cast<double>(rec.size()));
  r.kind = kind_error_path;
  return r;
}

/// How promptly deadline-bound operations end (the upper bounds the tests
/// leave to the benchmarks): how far past its 60 ms deadline a wait on a
/// missing key throws (tcp_store, hash_store, file_store); how far past its
/// 300 ms timeout a connect to a port nobody listens on gives up; how long a
/// wrong token takes to be refused; how long after its server is SIGKILLed a
/// pending get fails.
void deadlines(context& ctx) {
  const std::size_t samples = ctx.quick ? 5 : 20;
  using namespace std::chrono_literals;
  auto overrun = [](clock_type::time_point t0, ms deadline) { return clock_type::now() - t0 - deadline; };
  {
    server_and_client env;
    auto ex = asio::any_io_executor(env.client_loop.get_executor());
    char tmpl[] = "/tmp/corodist_bench_file_store_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0)
      throw std::runtime_error("mkstemp failed");
    ::close(fd);
    std::vector<std::pair<std::string, std::shared_ptr<cs::store>>> stores{
        {"tcp", run_blocking(ex, cs::tcp_store::connect(ex, client_options(env.port)))},
        {"hash", std::make_shared<cs::hash_store>(ex)},
        {"file", std::make_shared<cs::file_store>(ex, tmpl)}};
    for (auto& [name, store] : stores) {
      latency_recorder rec(samples);
      for (std::size_t i = 0; i < samples; ++i) {
        const auto t0 = clock_type::now();
        try {
          run_blocking(ex, store->wait({"bench/absent"}, 60ms));
        } catch (const timeout_error&) {
        }
        rec.add(overrun(t0, 60ms));
      }
      ctx.report(duration_record("wait_timeout_overrun_" + name, rec, {{"deadline_ms", 60}}));
    }
    ::unlink(tmpl);
  }
  {
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    int port = 0;
    { // a port nobody listens on
      asio::io_context io;
      asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
      port = a.local_endpoint().port();
    }
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < std::min<std::size_t>(samples, 5); ++i) {
      auto o = client_options(static_cast<std::uint16_t>(port));
      o.timeout = 300ms;
      const auto t0 = clock_type::now();
      try {
        run_blocking(ex, cs::tcp_store::connect(ex, o));
      } catch (const timeout_error&) {
      }
      rec.add(overrun(t0, 300ms));
    }
    ctx.report(duration_record("connect_timeout_overrun", rec, {{"timeout_ms", 300}}));
  }
  {
    event_loop server_loop, loop;
    server_loop.start();
    loop.start();
    cs::server_options so;
    so.auth_token = "s3cret";
    auto server = cs::store_server::start(server_loop.get_executor(), so);
    auto ex = asio::any_io_executor(loop.get_executor());
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < samples; ++i) {
      auto o = client_options(server->local_endpoint().port());
      o.auth_token = "wrong";
      const auto t0 = clock_type::now();
      try {
        run_blocking(ex, cs::tcp_store::connect(ex, o));
      } catch (const protocol_error&) {
      }
      rec.add(clock_type::now() - t0);
    }
    ctx.report(duration_record("auth_refusal", rec, {}));
    server.reset();
  }
  {
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < std::min<std::size_t>(samples, 5); ++i) {
      store_daemon daemon;
      auto s = run_blocking(ex, cs::tcp_store::connect(ex, client_options(daemon.port)));
      auto pending = asio::co_spawn(ex, s->get("bench/never", std::chrono::seconds(30)), asio::use_future);
      (void)run_blocking(ex, s->num_keys()); // answered in order: the get waits at the server
      const auto t0 = clock_type::now();
      ::kill(daemon.pid, SIGKILL);
      try {
        pending.get();
      } catch (const connection_error&) {
      }
      rec.add(clock_type::now() - t0);
      daemon.stop(SIGKILL);
    }
    ctx.report(duration_record("server_death_to_error", rec, {}));
  }
}

void run_store_suite(context& ctx) {
  raise_fd_limit();
  {
    server_and_client env;
    const auto torch = torch_store_peer(ctx, env.port); // same run, same pinning, our server on env's loop
    single_client(ctx, env, torch);
    concurrent_clients(ctx, env, torch);
  }
  rendezvous_cases(ctx);
  memory_per_connection(ctx);
  deadlines(ctx);
}

const suite_registrar registrar("store", &run_store_suite, 30, 17);

} // namespace
} // namespace corodist::bench
