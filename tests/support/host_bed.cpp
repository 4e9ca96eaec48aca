// The host test bed (host_bed.hpp): namespaces, veths and a bridge made with
// iproute2, faults with ip, nft and tc, all run as child processes.
#include "support/host_bed.hpp"

#include "subprocess.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::test {

namespace {

constexpr const char* netns_dir = "/var/run/netns"; // iproute2's NETNS_RUN_DIR
constexpr const char* name_head = "cdbed-";
constexpr const char* nft_table = "corodist_bed";

struct command_result {
  int status = -1; // exit status; -1: could not run, killed, or past the deadline
  std::string output;
};

/// Runs `argv` with stdout and stderr captured, for at most `limit`.
command_result run_command(const std::vector<std::string>& argv,
                           std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  command_result r;
  tools::pipe_fds out;
  tools::spawn_options o;
  o.argv = argv;
  o.stdout_fd = out.write_end();
  o.stderr_fd = out.write_end();
  pid_t pid = -1;
  try {
    pid = tools::spawn(o);
  } catch (const std::exception& e) {
    r.output = e.what();
    return r;
  }
  out.close_write();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      r.output += "\n(killed: still running after " + std::to_string(limit.count()) + " ms)";
      break;
    }
    pollfd p{out.read_end(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0)
      continue;
    char chunk[4096];
    const auto n = ::read(out.read_end(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    r.output.append(chunk, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv)
    s += (s.empty() ? "" : " ") + a;
  return s;
}

/// Runs `argv`; throws std::runtime_error naming it and its output unless it exits 0.
void must(const std::vector<std::string>& argv) {
  auto r = run_command(argv);
  if (r.status != 0)
    throw std::runtime_error("host_bed: `" + joined(argv) + "` failed (exit " + std::to_string(r.status) +
                             "): " + r.output);
}

/// Runs the iproute2 commands `lines` (one per line, without the leading
/// "ip") in one `ip [-n ns] -batch` process.
void ip_batch(const std::vector<std::string>& lines, const std::string& ns = {}) {
  char path[] = "/tmp/corodist_bed_XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0)
    throw std::runtime_error(std::string("host_bed: mkstemp: ") + std::strerror(errno));
  std::string text;
  for (const auto& l : lines)
    text += l + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  std::vector<std::string> argv{"ip"};
  if (!ns.empty())
    argv.insert(argv.end(), {"-n", ns});
  argv.insert(argv.end(), {"-batch", path});
  auto r = written ? run_command(argv) : command_result{-1, "could not write the batch file"};
  ::unlink(path);
  if (r.status != 0)
    throw std::runtime_error("host_bed: `" + joined(argv) + "` failed (exit " + std::to_string(r.status) +
                             ") on\n" + text + r.output);
}

/// Sends `sig` to `pid`; throws naming `what` when kill() fails.
void signal_to(pid_t pid, int sig, const char* what) {
  if (pid <= 0 || ::kill(pid, sig) != 0)
    throw std::runtime_error(fmt::format("host_bed: {} of process {} failed: {}", what, pid, std::strerror(errno)));
}

std::atomic<int> beds_made{0};

} // namespace

std::string host_bed::unavailable_reason() {
  static const std::string reason = [] {
    if (::geteuid() != 0)
      return std::string("not root: network namespaces, veths and nft rules need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)");
    const std::string probe = fmt::format("{}{}-probe", name_head, ::getpid());
    auto r = run_command({"ip", "netns", "add", probe});
    if (r.status != 0)
      return "`ip netns add` fails here (is iproute2 installed? scripts/setup.sh): " + r.output;
    run_command({"ip", "netns", "del", probe});
    return std::string();
  }();
  return reason;
}

std::vector<std::string> host_bed::namespaces(const std::string& prefix) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(netns_dir, ec)) {
    auto name = e.path().filename().string();
    if (name.starts_with(prefix))
      names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

int host_bed::sweep() {
  std::vector<std::string> dead;
  for (const auto& name : namespaces(name_head)) {
    const auto rest = name.substr(std::strlen(name_head));
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      dead.push_back("netns del " + name);
  }
  if (!dead.empty())
    ip_batch(dead);
  return static_cast<int>(dead.size());
}

host_bed::host_bed(int hosts) {
  if (hosts < 1 || hosts > max_hosts)
    throw std::invalid_argument(fmt::format("host_bed: {} hosts (1 to {})", hosts, max_hosts));
  sweep();
  const int k = beds_made++;
  prefix_ = fmt::format("{}{}-{}-", name_head, ::getpid(), k);
  switch_ns_ = prefix_ + "sw";
  for (int i = 0; i < hosts; ++i) {
    hosts_.push_back(fmt::format("{}h{}", prefix_, i));
    addresses_.push_back(fmt::format("10.213.{}.{}", k % 256, i + 1));
  }
  auto mac = [k](int i) { return fmt::format("02:cd:00:00:{:02x}:{:02x}", k % 256, i + 1); };
  try {
    // The namespaces and the veth pairs, each end created in its namespace.
    std::vector<std::string> root{"netns add " + switch_ns_};
    for (int i = 0; i < hosts; ++i)
      root.push_back("netns add " + hosts_[i]);
    for (int i = 0; i < hosts; ++i)
      root.push_back(fmt::format("link add p{} netns {} type veth peer name eth0 netns {}", i, switch_ns_, hosts_[i]));
    ip_batch(root);
    // The switch: a bridge without STP (ports forward at once), no address.
    std::vector<std::string> sw{"link add br0 type bridge stp_state 0", "link set br0 up"};
    for (int i = 0; i < hosts; ++i)
      sw.push_back(fmt::format("link set p{} master br0 up", i));
    ip_batch(sw, switch_ns_);
    // Each host: lo and eth0 up, its address, permanent neighbours.
    for (int i = 0; i < hosts; ++i) {
      std::vector<std::string> h{"link set lo up", "link set eth0 address " + mac(i),
                                 fmt::format("addr add {}/24 dev eth0", addresses_[i]), "link set eth0 up"};
      for (int j = 0; j < hosts; ++j)
        if (j != i)
          h.push_back(fmt::format("neigh replace {} lladdr {} nud permanent dev eth0", addresses_[j], mac(j)));
      ip_batch(h, hosts_[i]);
    }
  } catch (...) {
    std::vector<std::string> del;
    for (const auto& name : namespaces(prefix_))
      del.push_back("netns del " + name);
    try {
      if (!del.empty())
        ip_batch(del);
    } catch (...) {
    }
    throw;
  }
}

host_bed::~host_bed() {
  std::vector<std::string> del;
  for (const auto& name : namespaces(prefix_))
    del.push_back("netns del " + name);
  try {
    if (!del.empty())
      ip_batch(del);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_bed: cleanup failed: %s\n", e.what());
  }
}

void host_bed::check_host(int host) const {
  if (host < 0 || host >= size())
    throw std::out_of_range(fmt::format("host_bed: no host {} (the bed has {})", host, size()));
}

const std::string& host_bed::address(int host) const {
  check_host(host);
  return addresses_[static_cast<std::size_t>(host)];
}

const std::string& host_bed::netns(int host) const {
  check_host(host);
  return hosts_[static_cast<std::size_t>(host)];
}

std::unique_ptr<child_process> host_bed::run(int host, std::function<int()> body) const {
  const std::string path = std::string(netns_dir) + "/" + netns(host);
  const pid_t parent = ::getpid();
  return std::make_unique<child_process>([path, parent, body = std::move(body)]() -> int {
    // Dies with the test process: nothing is left running in a host.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)
      return 125;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      std::fprintf(stderr, "host_bed: cannot enter %s: %s\n", path.c_str(), std::strerror(errno));
      return 126;
    }
    ::close(fd);
    return body();
  });
}

void host_bed::kill9(pid_t pid) { signal_to(pid, SIGKILL, "kill -9"); }
void host_bed::stop(pid_t pid) { signal_to(pid, SIGSTOP, "SIGSTOP"); }
void host_bed::cont(pid_t pid) { signal_to(pid, SIGCONT, "SIGCONT"); }

void host_bed::link_down(int host) {
  check_host(host);
  must({"ip", "-n", switch_ns_, "link", "set", fmt::format("p{}", host), "down"});
}

void host_bed::link_up(int host) {
  check_host(host);
  must({"ip", "-n", switch_ns_, "link", "set", fmt::format("p{}", host), "up"});
}

void host_bed::ensure_nft_table() {
  if (nft_table_)
    return;
  // Frames from a port in set from_host (the host's traffic out) or to a port
  // in set to_host (its traffic in) are dropped as they cross the bridge.
  must({"ip", "netns", "exec", switch_ns_, "nft",
        fmt::format("add table bridge {0}; "
                    "add set bridge {0} from_host {{ type ifname; }}; "
                    "add set bridge {0} to_host {{ type ifname; }}; "
                    "add chain bridge {0} forward {{ type filter hook forward priority 0; policy accept; }}; "
                    "add rule bridge {0} forward iifname @from_host drop; "
                    "add rule bridge {0} forward oifname @to_host drop",
                    nft_table)});
  nft_table_ = true;
}

void host_bed::block(int host, direction d) {
  check_host(host);
  ensure_nft_table();
  must({"ip", "netns", "exec", switch_ns_, "nft",
        fmt::format("add element bridge {} {} {{ \"p{}\" }}", nft_table, d == direction::out ? "from_host" : "to_host",
                    host)});
}

void host_bed::unblock(int host, direction d) {
  check_host(host);
  if (!nft_table_)
    return;
  const auto set = d == direction::out ? "from_host" : "to_host";
  const auto port = fmt::format("p{}", host);
  auto listed = run_command({"ip", "netns", "exec", switch_ns_, "nft", "list", "set", "bridge", nft_table, set});
  if (listed.status == 0 && listed.output.find("\"" + port + "\"") == std::string::npos)
    return; // not blocked
  must({"ip", "netns", "exec", switch_ns_, "nft",
        fmt::format("delete element bridge {} {} {{ \"{}\" }}", nft_table, set, port)});
}

void host_bed::limit(int host, std::uint64_t bits_per_second) {
  check_host(host);
  if (bits_per_second == 0)
    throw std::invalid_argument("host_bed: a limit of 0 bit/s (use link_down for no traffic)");
  // The bucket holds 10 ms at the rate, and at least 64 KiB (a GSO segment);
  // packets wait in the queue at most 100 ms, later ones are dropped.
  const auto burst = std::max<std::uint64_t>(bits_per_second / 8 / 100, 64 * 1024);
  const auto rate = std::to_string(bits_per_second) + "bit";
  const auto b = std::to_string(burst) + "b";
  must({"tc", "-n", hosts_[static_cast<std::size_t>(host)], "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
        rate, "burst", b, "latency", "100ms"});
  must({"tc", "-n", switch_ns_, "qdisc", "replace", "dev", fmt::format("p{}", host), "root", "tbf", "rate", rate,
        "burst", b, "latency", "100ms"});
}

void host_bed::unlimit(int host) {
  check_host(host);
  // (Deleting a root qdisc that is not there fails; the default one is left as it is.)
  for (const auto& [ns, dev] : {std::pair{hosts_[static_cast<std::size_t>(host)], std::string("eth0")},
                                std::pair{switch_ns_, fmt::format("p{}", host)}}) {
    auto shown = run_command({"tc", "-n", ns, "qdisc", "show", "dev", dev, "root"});
    if (shown.output.find("tbf") != std::string::npos)
      must({"tc", "-n", ns, "qdisc", "del", "dev", dev, "root"});
  }
}

} // namespace corodist::test
