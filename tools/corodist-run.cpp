// corodist-run: start the local ranks of a job, like torchrun.
//
//   corodist-run --nproc 4 -- ./train --epochs 3
//   corodist-run --nnodes 2 --node-rank K --nproc 8 --master-addr HOST --master-port 29500 -- ./train
//   corodist-run --nnodes 1:4 --max-restarts 3 --nproc 8 --master-addr HOST --master-port 29500 -- ./train
//
// The launcher of node 0 hosts the job's store (a store_server in this
// process, on --master-addr:--master-port); the launchers of all nodes meet
// in it for each generation of workers (a rendezvous round), and every rank,
// rank 0 included, connects to it as a client (TORCHELASTIC_USE_AGENT_STORE).
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE=True and
// CORODIST_GENERATION; stdin from /dev/null and a process group of its own;
// every line it writes comes out prefixed "[RANK] " on our stdout or stderr.
// SIGINT/SIGTERM/SIGHUP are passed on to every rank; when a rank fails, the
// others get SIGTERM and, after --grace-period, SIGKILL; with --max-restarts
// the workers of every node are then started again under a new generation.

#include "subprocess.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/sync_store.hpp>
#include <corodist/store/tcp_store.hpp>

#include "store/launch_env.hpp"

#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/tcp.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;
using corodist::tools::describe_wait_status;
namespace cs = corodist::store;

constexpr std::size_t max_line_bytes = 64 * 1024; // a longer line is cut into pieces of this size
constexpr auto drain_time = std::chrono::seconds(2); // output still read after the last rank ended
constexpr int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP};
/// Lines of each rank's stderr kept (at most tail_line_bytes each) for the report of its failure.
constexpr std::size_t stderr_tail_lines = 20;
constexpr std::size_t tail_line_bytes = 1024;
/// Once MIN nodes are in, how long node 0's launcher waits for more (torchrun's last call).
constexpr double default_join_window_s = 30.0;
/// How long a launcher waits for a rendezvous round to close (torchrun's join timeout).
constexpr double default_join_timeout_s = 600.0;
/// At the end, how long node 0's launcher keeps the store up for the launchers still connected.
constexpr auto host_linger = std::chrono::seconds(5);
/// The launchers' waits on the store are cut in slices this long, so that a
/// signal to the launcher is seen between them.
constexpr auto wait_slice = std::chrono::milliseconds(250);
/// A watcher's wait for the end of a generation is renewed after this long
/// (shorter than the 5 s after which the store client warns of a long wait).
constexpr auto watch_slice = std::chrono::seconds(2);

int signal_pipe[2] = {-1, -1};
int wake_pipe[2] = {-1, -1}; // the store watcher (on the loop thread) wakes the supervisor

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = ::write(signal_pipe[1], &b, 1);
  errno = saved;
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; // our own output is gone (EPIPE): keep supervising the ranks
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& text) {
  std::string line = "corodist-run: " + text + "\n";
  write_all(2, line.data(), line.size());
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::chrono::milliseconds to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(std::llround(s * 1000.0)));
}

/// The launcher was stopped by a signal while no worker ran.
struct stopped_by_signal {
  int sig;
};

/// A job-level fault of the launch itself (two nodes claiming one rank, ...).
class launch_error : public corodist::error {
public:
  using corodist::error::error;
};

/// One output stream of a rank: reads what the rank wrote and copies it to
/// `dest_fd` line by line, each line prefixed.
class prefixed_stream {
public:
  prefixed_stream(int fd, int dest_fd, std::string prefix, std::size_t keep_lines = 0)
      : fd_(fd), dest_fd_(dest_fd), prefix_(std::move(prefix)), keep_lines_(keep_lines) {
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  prefixed_stream(const prefixed_stream&) = delete;
  prefixed_stream& operator=(const prefixed_stream&) = delete;
  ~prefixed_stream() { close(); }

  int fd() const noexcept { return fd_; }
  /// The last `keep_lines` lines passed on (without prefix or newline), oldest first.
  const std::deque<std::string>& tail() const noexcept { return tail_; }
  bool open() const noexcept { return fd_ >= 0; }

  /// Reads what is there; at end of stream emits the partial last line and closes.
  void on_readable() {
    char chunk[16384];
    for (;;) {
      auto n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      if (n <= 0) {
        finish();
        return;
      }
      pending_.append(chunk, static_cast<std::size_t>(n));
      emit_lines();
    }
  }

  /// Emits the partial last line (with a newline added) and closes the stream.
  void finish() {
    if (!pending_.empty()) {
      pending_ += '\n';
      emit_lines();
    }
    close();
  }

private:
  void emit_lines() {
    std::string out;
    std::size_t start = 0;
    for (;;) {
      auto nl = pending_.find('\n', start);
      if (nl == std::string::npos) {
        if (pending_.size() - start < max_line_bytes)
          break;
        nl = start + max_line_bytes - 1; // an overlong line: pass this piece on as a line of its own
        out += prefix_;
        out.append(pending_, start, nl + 1 - start);
        out += '\n';
        keep(start, nl + 1);
        start = nl + 1;
        continue;
      }
      out += prefix_;
      out.append(pending_, start, nl + 1 - start);
      keep(start, nl);
      start = nl + 1;
    }
    pending_.erase(0, start);
    write_all(dest_fd_, out.data(), out.size());
  }

  // Keeps pending_[from, to) as the newest line of the tail (cut at tail_line_bytes).
  void keep(std::size_t from, std::size_t to) {
    if (keep_lines_ == 0)
      return;
    tail_.push_back(pending_.substr(from, std::min(to - from, tail_line_bytes)));
    if (tail_.size() > keep_lines_)
      tail_.pop_front();
  }

  void close() {
    if (fd_ >= 0)
      ::close(std::exchange(fd_, -1));
  }

  int fd_;
  int dest_fd_;
  std::string prefix_;
  std::string pending_;
  std::size_t keep_lines_;
  std::deque<std::string> tail_;
};

enum class restart_policy { all, worker };

struct settings {
  int nproc = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  bool elastic = false; // --nnodes MIN:MAX: node ranks come from the rendezvous
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double grace_s = 5.0;
  int max_restarts = 0;
  restart_policy policy = restart_policy::all;
  double join_window_s = default_join_window_s;
  double join_timeout_s = default_join_timeout_s;
  std::vector<std::string> command;
};

struct rank_process {
  int rank = 0;
  int local = 0;
  int restarts = 0; // TORCHELASTIC_RESTART_COUNT it was started with
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  std::unique_ptr<prefixed_stream> out;
  std::unique_ptr<prefixed_stream> err;
};

/// This node's place in a generation, as node 0's launcher decided it.
struct assignment {
  int nodes = 1;
  int world = 1;
  int node_rank = 0;
  int rank_base = 0;
  int restart_count = 0;
};

/// What a watcher of a generation's end key hands the supervisor.
struct watch_state {
  std::mutex m;
  std::optional<std::string> value;
  std::atomic<bool> closing{false};
};

// Waits (on the loop) for a generation's end key and wakes the supervisor
// with its value, or with "lost <why>" when the store is gone.
asio::awaitable<void> watch_end(std::shared_ptr<cs::store> store, std::string key, std::shared_ptr<watch_state> w) {
  std::string v;
  for (;;) {
    try {
      v = co_await store->get(key, watch_slice);
      break;
    } catch (const corodist::timeout_error&) {
      if (w->closing)
        co_return;
    } catch (const std::exception& e) {
      if (w->closing)
        co_return;
      v = std::string("lost ") + e.what();
      break;
    }
  }
  {
    std::lock_guard lock(w->m);
    w->value = std::move(v);
  }
  const char b = 'w';
  [[maybe_unused]] auto n = ::write(wake_pipe[1], &b, 1);
}

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

class launcher {
public:
  explicit launcher(settings s) : s_(std::move(s)) {}
  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;
  ~launcher() {
    if (devnull_ >= 0)
      ::close(devnull_);
  }

  int run() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe2");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &sa, nullptr);
    for (int sig : forwarded_signals)
      ::sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    loop_.start();
    int code = 1;
    try {
      open_store();
      code = run_generations();
    } catch (const stopped_by_signal& st) {
      say("stopped by " + signal_name(st.sig));
      code = 128 + st.sig;
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (!host_ && store_ && dynamic_cast<const corodist::connection_error*>(&e))
        what = "lost the job's store at " + store_address() + " (the launcher of node 0 hosts it: has it ended?): " +
               what;
      say(what);
      code = 1;
    }
    close_store();
    return code;
  }

private:
  std::string store_address() const {
    return (s_.master_addr.find(':') != std::string::npos ? "[" + s_.master_addr + "]" : s_.master_addr) + ":" +
           std::to_string(s_.master_port);
  }

  // Node 0 (for --nnodes MIN:MAX: the launcher that can bind the address)
  // hosts the store in this process; every launcher connects to it.
  void open_store() {
    const bool try_host = s_.elastic || s_.node_rank == 0;
    if (try_host) {
      cs::server_options so;
      try {
        asio::ip::tcp::resolver resolver(loop_.context());
        auto found = resolver.resolve(s_.master_addr, std::to_string(s_.master_port));
        if (found.empty())
          throw corodist::connection_error("no address");
        so.host = found.begin()->endpoint().address().to_string();
      } catch (const std::system_error& e) {
        throw corodist::connection_error("cannot resolve --master-addr '" + s_.master_addr + "': " + e.what());
      }
      so.port = static_cast<std::uint16_t>(s_.master_port);
      try {
        server_ = cs::store_server::start(loop_.get_executor(), so);
        host_ = true;
        s_.master_port = server_->local_endpoint().port();
      } catch (const corodist::connection_error& e) {
        if (!s_.elastic)
          throw corodist::connection_error("node 0 cannot host the job's store on " + store_address() + ": " +
                                           e.what() + " (another program listens there, or an earlier job's "
                                           "launcher still runs: stop it or pick another --master-port)");
        // Another launcher hosts it (or the address is another host's): a client.
      }
    }
    cs::tcp_store_options to;
    to.host = s_.master_addr;
    to.port = static_cast<std::uint16_t>(s_.master_port);
    to.timeout = to_ms(s_.join_timeout_s);
    store_ = cs::tcp_store::connect_sync(loop_.get_executor(), to);
    sync_ = std::make_unique<cs::sync_store>(store_);
  }

  void close_store() {
    if (watch_)
      watch_->closing = true;
    if (host_ && server_ && sync_) {
      try {
        // Whoever still waits for a round tells the job is over; then the
        // others get a moment to read the end and disconnect.
        (void)sync_->compare_set(round_key(generation_ + 1) + "closed", "", "done");
        (void)corodist::run_blocking(loop_.get_executor(), server_->clients_left(1, host_linger),
                                     "the launcher's linger");
      } catch (const std::exception&) {
      }
    }
    if (auto* t = dynamic_cast<cs::tcp_store*>(store_.get()))
      t->close();
    if (server_)
      server_->stop();
  }

  // Hands each signal number waiting in the signal pipe to `on`.
  template <typename F>
  void drain_signals(F&& on) {
    unsigned char buf[64];
    for (;;) {
      auto n = ::read(signal_pipe[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return;
      for (ssize_t i = 0; i < n; ++i)
        on(static_cast<int>(buf[i]));
    }
  }

  // Reads the signal pipe between waits on the store (no worker runs then).
  void check_signals() {
    drain_signals([](int sig) {
      if (sig != SIGCHLD)
        throw stopped_by_signal{sig};
    });
  }

  // Waits for `key` at most `limit` (zero: forever), in slices; nullopt at the limit.
  std::optional<std::string> wait_key(const std::string& key, std::chrono::milliseconds limit) {
    const auto deadline = clock_type::now() + limit;
    for (;;) {
      check_signals();
      auto slice = wait_slice;
      if (limit.count() > 0) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
        if (left.count() <= 0)
          return std::nullopt;
        slice = std::min(slice, left);
      }
      try {
        sync_->wait({key}, slice);
        return sync_->get(key);
      } catch (const corodist::timeout_error&) {
      }
    }
  }

  std::string must_wait_key(const std::string& key, const std::string& what) {
    auto v = wait_key(key, to_ms(s_.join_timeout_s));
    if (!v)
      throw corodist::timeout_error("gave up after " + fmt_seconds(s_.join_timeout_s) +
                                    " (--join-timeout) waiting for " + what);
    return *v;
  }

  // ---- rendezvous rounds -------------------------------------------------

  // Joins the round of generation_ (and of later ones when this node came
  // after a round had closed); false when the job ended meanwhile.
  bool join_round() {
    if (generation_ == 0 && sync_->check({corodist::store::detail::generation_key}))
      generation_ = to_int(sync_->get(corodist::store::detail::generation_key)); // a node that comes late
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
  void close_round(const std::string& base) {
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
    sync_->set(corodist::store::detail::generation_key, std::to_string(generation_));
    sync_->set(base + "closed", "ok " + std::to_string(restart_count_) + " " + std::to_string(world) + " " +
                                    std::to_string(nodes.size()) + lines);
  }

  // ---- generations ---------------------------------------------------------

  int run_generations() {
    for (;;) {
      if (!join_round())
        return 0; // the job ended while this node waited to join
      restart_count_ = assignment_.restart_count;
      if (s_.elastic || generation_ > 0)
        say("generation " + std::to_string(generation_) + ": node " + std::to_string(assignment_.node_rank) + " of " +
            std::to_string(assignment_.nodes) + ", ranks " + std::to_string(assignment_.rank_base) + ".." +
            std::to_string(assignment_.rank_base + s_.nproc - 1) + " of " + std::to_string(assignment_.world));
      const auto end = supervise_generation();
      if (auto code = decide(end))
        return *code;
      if (!split_word(end).first.starts_with("admit"))
        ++restart_count_;
      ++generation_;
    }
  }

  std::string end_key() const { return round_key(generation_) + "end"; }

  // Sets the generation's end (the first setter wins); a lost store ends it too.
  void set_end(const std::string& value) {
    try {
      (void)sync_->compare_set(end_key(), "", value);
    } catch (const std::exception& e) {
      if (!end_)
        end_ = std::string("lost ") + e.what();
    }
  }

  std::string node_name() const { return "node " + std::to_string(assignment_.node_rank); }

  // What to do once a generation has ended: an exit status, or nullopt to start the next.
  std::optional<int> decide(const std::string& end) {
    auto [word, rest] = split_word(end);
    if (word == "done")
      return 0;
    if (word == "restart") {
      std::string line = rest + ": restarting the workers of every node under generation " +
                         std::to_string(generation_ + 1) + " (restart " + std::to_string(restart_count_ + 1) + " of " +
                         std::to_string(s_.max_restarts) + ")";
      say(line);
      failure_.reset();
      return std::nullopt;
    }
    if (word == "admit") {
      say(rest + ": restarting the workers of every node under generation " + std::to_string(generation_ + 1) +
          " (not counted as a restart)");
      failure_.reset();
      return std::nullopt;
    }
    if (word == "failed" || word == "stopped") {
      auto [code_text, text] = split_word(rest);
      const int code = to_int(code_text);
      if (word == "stopped" && stop_signal_) {
        say("stopped by " + signal_name(*stop_signal_));
        return 128 + *stop_signal_;
      }
      if (word == "failed" && failure_) {
        report_failure();
        return code != 0 ? code : 1;
      }
      say("the job ended: " + text + "; this node's workers were stopped");
      return code != 0 ? code : 1;
    }
    if (word == "lost") {
      say("lost the job's store at " + store_address() + " (the launcher of node 0 hosts it: has it ended?): " + rest +
          "; this node's workers were stopped");
      return 1;
    }
    throw launch_error("unexpected end of generation " + std::to_string(generation_) + ": '" + end + "'");
  }

  struct failure_record {
    int rank = 0;
    pid_t pid = -1;
    std::string what;
    int code = 1;
    std::deque<std::string> tail;
    bool tail_taken = false;
  };

  void report_failure() {
    auto& f = *failure_;
    std::string line = "rank " + std::to_string(f.rank);
    if (f.pid > 0)
      line += " (pid " + std::to_string(f.pid) + ")";
    line += " failed: " + f.what;
    int others = 0;
    for (auto& r : ranks_)
      others += r.rank != f.rank && r.pid > 0;
    if (others > 0 || assignment_.nodes > 1)
      line += "; the other ranks were stopped";
    if (s_.max_restarts > 0)
      line += "; restarts spent (" + std::to_string(s_.max_restarts) + ")";
    say(line);
    if (!f.tail.empty()) {
      say("the last " + std::to_string(f.tail.size()) + " lines of rank " + std::to_string(f.rank) + "'s stderr:");
      for (auto& l : f.tail)
        say("  [" + std::to_string(f.rank) + "] " + l);
    }
  }

  // ---- workers -------------------------------------------------------------

  std::vector<std::pair<std::string, std::string>> worker_env(const rank_process& r) const {
    return {{"RANK", std::to_string(r.rank)},
            {"WORLD_SIZE", std::to_string(assignment_.world)},
            {"LOCAL_RANK", std::to_string(r.local)},
            {"LOCAL_WORLD_SIZE", std::to_string(s_.nproc)},
            {"GROUP_RANK", std::to_string(assignment_.node_rank)},
            {"GROUP_WORLD_SIZE", std::to_string(assignment_.nodes)},
            {"MASTER_ADDR", s_.master_addr},
            {"MASTER_PORT", std::to_string(s_.master_port)},
            {"TORCHELASTIC_RESTART_COUNT", std::to_string(r.restarts)},
            {"TORCHELASTIC_MAX_RESTARTS", std::to_string(s_.max_restarts)},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {corodist::store::detail::generation_variable, std::to_string(generation_)}};
  }

  // Starts (or restarts) one rank; false when it could not be started (then a failure is recorded).
  bool spawn_rank(rank_process& r) {
    corodist::tools::pipe_fds out, err;
    corodist::tools::spawn_options o;
    o.argv = s_.command;
    o.env = worker_env(r);
    o.stdin_fd = devnull_;
    o.stdout_fd = out.write_end();
    o.stderr_fd = err.write_end();
    o.new_process_group = true;
    o.die_with_parent = true;
    o.close_other_fds = true; // the store's sockets stay ours
    try {
      r.pid = corodist::tools::spawn(o);
    } catch (const std::system_error& e) {
      say("rank " + std::to_string(r.rank) + ": " + e.what());
      r.pid = -1;
      on_failure(r, "could not be started", 127);
      return false;
    }
    r.running = true;
    const std::string prefix = "[" + std::to_string(r.rank) + "] ";
    r.out = std::make_unique<prefixed_stream>(dup_read(out), 1, prefix);
    r.err = std::make_unique<prefixed_stream>(dup_read(err), 2, prefix, stderr_tail_lines);
    return true;
  }

  void start_ranks() {
    ranks_.clear();
    ranks_.resize(static_cast<std::size_t>(s_.nproc));
    for (int local = 0; local < s_.nproc; ++local) {
      auto& r = ranks_[static_cast<std::size_t>(local)];
      r.rank = assignment_.rank_base + local;
      r.local = local;
      r.restarts = restart_count_;
    }
    for (auto& r : ranks_)
      if (!spawn_rank(r))
        return;
  }

  static int dup_read(corodist::tools::pipe_fds& p) {
    int fd = ::fcntl(p.read_end(), F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
      throw std::system_error(errno, std::generic_category(), "fcntl");
    return fd;
  }

  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const rank_process& r) { return r.running; });
  }

  // Sends `sig` to the process group of every rank that runs or still has output open.
  void signal_ranks(int sig) {
    for (auto& r : ranks_)
      if (r.pid > 0 && (r.running || (r.out && r.out->open()) || (r.err && r.err->open())))
        ::kill(-r.pid, sig);
  }

  void start_teardown(int sig) {
    tearing_down_ = true;
    signal_ranks(sig);
    if (!kill_deadline_)
      kill_deadline_ = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                               std::chrono::duration<double>(s_.grace_s));
  }

  // A rank failed: restart it alone (--restart-policy worker), or stop this
  // node's ranks and end the generation with a restart or a failure.
  void on_failure(rank_process& r, const std::string& what, int code) {
    const std::string who =
        "rank " + std::to_string(r.rank) + (r.pid > 0 ? " (pid " + std::to_string(r.pid) + ")" : "");
    if (s_.policy == restart_policy::worker && worker_restarts_ < s_.max_restarts && r.pid > 0) {
      ++worker_restarts_;
      say(who + " failed: " + what + "; restarting it (restart " + std::to_string(worker_restarts_) + " of " +
          std::to_string(s_.max_restarts) + ", --restart-policy worker)");
      // Its output may still come: the old streams are read until they close.
      if (r.out)
        retired_.push_back(std::move(r.out));
      if (r.err)
        retired_.push_back(std::move(r.err));
      ++r.restarts;
      spawn_rank(r);
      return;
    }
    failure_ = failure_record{r.rank, r.pid, what, code, {}, false};
    failed_ = &r;
    start_teardown(SIGTERM);
    const bool again = s_.policy == restart_policy::all && restart_count_ < s_.max_restarts;
    const std::string text = node_name() + ": " + who + " failed: " + what;
    set_end(again ? "restart " + text : "failed " + std::to_string(code) + " " + text);
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR)
        continue;
      if (pid <= 0)
        return;
      for (auto& r : ranks_) {
        if (r.pid != pid || !r.running)
          continue;
        r.running = false;
        r.status = status;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !tearing_down_ && !end_)
          on_failure(r, describe_wait_status(status), WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      }
    }
  }

  void on_signals() {
    drain_signals([this](int sig) {
      if (sig == SIGCHLD) {
        reap();
        return;
      }
      if (!stop_signal_) {
        stop_signal_ = sig;
        set_end("stopped " + std::to_string(128 + sig) + " the launcher of " + node_name() + " got " +
                signal_name(sig));
      }
      // The same signal again (coreutils' timeout sends it to the launcher,
      // then to its process group): the ranks already have it.
      if (!signals_seen_.insert(sig).second)
        return;
      say("got " + signal_name(sig) + ", passing it to the ranks");
      start_teardown(sig);
    });
  }

  void on_wake() {
    char buf[64];
    while (::read(wake_pipe[0], buf, sizeof buf) > 0) {
    }
    std::lock_guard lock(watch_->m);
    if (!end_ && watch_->value)
      end_ = *watch_->value;
  }

  // This node's ranks all ended well: counted; the last node ends the generation.
  void report_finished() {
    finished_reported_ = true;
    try {
      const auto n = sync_->add(round_key(generation_) + "finished", 1);
      if (n >= assignment_.nodes)
        set_end("done");
    } catch (const std::exception& e) {
      if (!end_)
        end_ = std::string("lost ") + e.what();
    }
  }

  // Runs one generation of this node's workers; returns how it ended (the
  // value of its end key).
  std::string supervise_generation() {
    end_.reset();
    failure_.reset();
    failed_ = nullptr;
    tearing_down_ = false;
    finished_reported_ = false;
    kill_deadline_.reset();
    retired_.clear();
    worker_restarts_ = 0;
    watch_ = std::make_shared<watch_state>();
    asio::co_spawn(loop_.get_executor(), watch_end(store_, end_key(), watch_), asio::detached);
    start_ranks();
    std::optional<clock_type::time_point> drain_deadline;
    bool killed = false;
    reap(); // a rank may have ended before the handler was of any use
    for (;;) {
      if (end_ && any_running() && !tearing_down_)
        start_teardown(SIGTERM);
      if (!end_ && !any_running() && !finished_reported_ && !failure_ && !stop_signal_)
        report_finished();
      const auto now = clock_type::now();
      if (end_ && !any_running() && !drain_deadline)
        drain_deadline = now + drain_time;
      std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
      std::vector<prefixed_stream*> streams;
      auto add_stream = [&](prefixed_stream* st) {
        if (st && st->open()) {
          fds.push_back({st->fd(), POLLIN, 0});
          streams.push_back(st);
        }
      };
      for (auto& r : ranks_) {
        add_stream(r.out.get());
        add_stream(r.err.get());
      }
      for (auto& st : retired_)
        add_stream(st.get());
      if (drain_deadline && (streams.empty() || now >= *drain_deadline))
        break;
      auto wake = drain_deadline.value_or(clock_type::time_point::max());
      if (kill_deadline_ && !killed)
        wake = std::min(wake, *kill_deadline_);
      int timeout_ms = -1;
      if (wake != clock_type::time_point::max())
        timeout_ms = static_cast<int>(std::max<long>(
            0, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR)
        throw std::system_error(errno, std::generic_category(), "poll");
      if (n > 0) {
        for (std::size_t i = 2; i < fds.size(); ++i)
          if (fds[i].revents != 0)
            streams[i - 2]->on_readable();
        if (fds[0].revents != 0)
          on_signals();
        if (fds[1].revents != 0)
          on_wake();
      }
      if (kill_deadline_ && !killed && clock_type::now() >= *kill_deadline_) {
        killed = true;
        for (auto& r : ranks_)
          if (r.running)
            say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") did not stop within " +
                fmt_seconds(s_.grace_s) + ": sending SIGKILL");
        signal_ranks(SIGKILL);
      }
    }
    for (auto& r : ranks_)
      for (auto* st : {r.out.get(), r.err.get()})
        if (st && st->open())
          st->finish(); // a process the rank left behind still holds it: take what came
    for (auto& st : retired_)
      if (st->open())
        st->finish();
    if (failure_ && failed_ && failed_->err)
      failure_->tail = failed_->err->tail();
    watch_->closing = true;
    return *end_;
  }

  settings s_;
  corodist::event_loop loop_; // first: destroyed last, after the store objects that post to it
  std::shared_ptr<cs::store_server> server_;
  std::shared_ptr<cs::store> store_;
  std::unique_ptr<cs::sync_store> sync_;
  bool host_ = false;
  int devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  std::int64_t generation_ = 0;
  int restart_count_ = 0;
  assignment assignment_;

  std::vector<rank_process> ranks_;
  std::vector<std::unique_ptr<prefixed_stream>> retired_; // streams of ranks restarted in place
  std::shared_ptr<watch_state> watch_;
  std::optional<std::string> end_;
  std::optional<failure_record> failure_;
  rank_process* failed_ = nullptr;
  bool tearing_down_ = false;
  bool finished_reported_ = false;
  int worker_restarts_ = 0;
  std::optional<clock_type::time_point> kill_deadline_;
  std::optional<int> stop_signal_;
  std::set<int> signals_seen_; // passed on to the ranks already
};

// "N" or "MIN:MAX" into `s`; an error text, empty when it parsed.
std::string parse_nnodes(const std::string& text, settings& s) {
  auto colon = text.find(':');
  auto number = [](const std::string& t, int& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc{} && p == t.data() + t.size() && v >= 1 && v <= (1 << 20);
  };
  if (colon == std::string::npos) {
    if (!number(text, s.min_nodes))
      return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
    s.max_nodes = s.min_nodes;
    return {};
  }
  if (!number(text.substr(0, colon), s.min_nodes) || !number(text.substr(colon + 1), s.max_nodes) ||
      s.min_nodes > s.max_nodes)
    return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
  s.elastic = true;
  return {};
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"corodist-run: start the local ranks of a job with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
               "MASTER_ADDR and MASTER_PORT set, like torchrun; the launcher of node 0 hosts the job's store; output "
               "lines are prefixed with the rank; a failing rank stops the others, and with --max-restarts every "
               "node's workers are started again under a new generation.",
               "corodist-run"};
  settings s;
  std::string nnodes = "1";
  std::string policy = "all";
  app.add_option("--nproc,--nproc-per-node", s.nproc, "processes to start on this node")
      ->required()
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", nnodes,
                 "nodes in the job (each runs corodist-run): N, or MIN:MAX to start once MIN are in and take up to "
                 "MAX that come within --join-window")
      ->capture_default_str();
  auto* node_rank = app.add_option("--node-rank", s.node_rank, "this node's index, 0 <= K < nnodes (--nnodes N only)")
                        ->capture_default_str();
  auto* addr = app.add_option("--master-addr", s.master_addr,
                              "address of the job's store, hosted by the launcher of node 0")
                   ->capture_default_str();
  auto* port = app.add_option("--master-port", s.master_port, "port of the job's store (default: a free port)")
                   ->check(CLI::Range(0, 65535));
  app.add_option("--grace-period", s.grace_s, "seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--max-restarts", s.max_restarts,
                 "times the workers are started again after a failure before the job fails")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--restart-policy", policy,
                 "all: stop every node's workers and start them again under a new generation; worker: restart only "
                 "the failed worker, same rank, same generation")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "worker"}));
  app.add_option("--join-window", s.join_window_s,
                 "with --nnodes MIN:MAX, seconds node 0 waits for more nodes once MIN are in")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--join-timeout", s.join_timeout_s,
                 "seconds a launcher waits for the store and for a rendezvous round to close")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("command", s.command, "the program and its arguments, after --")->required();
  CLI11_PARSE(app, argc, argv);

  if (auto why = parse_nnodes(nnodes, s); !why.empty()) {
    say(why);
    return 2;
  }
  s.policy = policy == "worker" ? restart_policy::worker : restart_policy::all;
  if (s.elastic && *node_rank) {
    say("with --nnodes MIN:MAX the rendezvous assigns the node ranks: drop --node-rank");
    return 2;
  }
  if (!s.elastic && (s.node_rank < 0 || s.node_rank >= s.max_nodes)) {
    say("--node-rank " + std::to_string(s.node_rank) + " is outside 0.." + std::to_string(s.max_nodes - 1));
    return 2;
  }
  if (s.max_nodes > 1 && (!*addr || !*port || s.master_port == 0)) {
    say("with more than one node every node needs the same --master-addr and --master-port");
    return 2;
  }
  try {
    return launcher(std::move(s)).run();
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
