#pragma once
// A test bed of real hosts on one machine: N network namespaces ("hosts"),
// each with its own IPv4 address on one Ethernet segment, code run inside
// them as forked processes, and faults injected from the test process.
//
// Layout of a bed of n hosts (k: the bed's number in this process):
//
//   namespace cdbed-<pid>-<k>-sw : bridge br0, ports p0 .. p<n-1>
//   namespace cdbed-<pid>-<k>-h<i>: lo (up), eth0 = the peer of p<i>,
//                                   address 10.213.<k>.<i+1>/24,
//                                   MAC 02:cd:00:00:<k>:<i+1>,
//                                   a permanent neighbour entry for every
//                                   other host (no ARP: a partition stays silent)
//
// The switch namespace has no address: hosts reach one another and nothing
// else (not the root namespace, not 127.0.0.1 of the test process).
//
// Faults (each takes effect at once; all are undone by the destructor):
//   kill9 / stop / cont  SIGKILL, SIGSTOP, SIGCONT to a process started by run()
//   link_down / link_up  the switch's end of the host's veth down / up: the host
//                        loses its carrier; its packets and those sent to it
//                        vanish (no RST, no FIN, no ICMP): a silent partition
//   block / unblock      an nft rule on the switch (table bridge corodist_bed)
//                        dropping the frames that come from the host
//                        (direction::out) or go to it (direction::in): an
//                        asymmetric partition, silent as well
//   limit / unlimit      a tc tbf bandwidth limit on both ends of the host's
//                        veth (its traffic out and in)
//
// Cleanup: the destructor deletes the bed's namespaces (which takes their
// veths, bridge, nft tables and qdiscs with them); the constructor first
// sweeps the namespaces left by beds of processes that are gone (their names
// carry the pid). Processes started by run() are the caller's (child_process
// kills and reaps them at scope exit): declare the bed before them, so that
// they go first.
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2 (ip, tc) and, for
// block(), nftables. Suites that use it take host_bed::available as their
// precondition: without root or namespaces they are skipped, saying why.
// The bed itself needs no Boost.Test (corodist-bench's ft suite uses it):
// `available` is defined apart, in host_bed_precondition.cpp, which only the
// tests link.
//
//   corodist::test::host_bed bed(3);
//   auto server = bed.run(0, [&] { /* listens on bed.address(0) */ return 0; });
//   bed.link_down(0);   // host 0 vanishes from the network
//   bed.link_up(0);
//   corodist::test::host_bed::kill9(server->pid());
//
// A program (corodist-run, an example) runs in a host through `ip netns
// exec`, which execs it in place (its pid is the program's):
//   corodist::test::program job({"ip", "netns", "exec", bed.netns(1), CORODIST_RUN_PATH, ...});

#include "support/child_process.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

namespace boost::test_tools {
class assertion_result;
} // namespace boost::test_tools

namespace corodist::test {

/// A direction of a host's traffic: what it receives, or what it sends.
enum class direction { in, out };

/// N hosts as network namespaces behind one bridge (see the file comment).
/// Used from the test process's main thread; not thread-safe.
class host_bed {
public:
  /// The most hosts a bed can have.
  static constexpr int max_hosts = 200;

  /// Makes `hosts` hosts (1..max_hosts), after sweeping leftovers of dead
  /// processes. Throws std::runtime_error naming the failed command and its
  /// output (what was made so far is removed).
  explicit host_bed(int hosts);
  /// Removes the namespaces (and with them the veths, bridge, nft table and
  /// qdiscs). Never throws; a failure is printed to stderr.
  ~host_bed();
  host_bed(const host_bed&) = delete;
  host_bed& operator=(const host_bed&) = delete;

  /// Why no bed can be made here, or "" when one can: not root, no `ip`, or
  /// `ip netns add` fails (probed once per process).
  static std::string unavailable_reason();
  /// Boost.Test precondition: skips the suite or case, printing the reason,
  /// where unavailable_reason() is not empty. (Its parameter is a
  /// boost::unit_test::test_unit_id. Defined in host_bed_precondition.cpp,
  /// linked into the tests only.)
  static boost::test_tools::assertion_result available(unsigned long test_unit);

  /// The number of hosts.
  int size() const noexcept { return static_cast<int>(addresses_.size()); }
  /// Host `host`'s IPv4 address, e.g. "10.213.0.1" (what servers on it bind
  /// and what its peers dial).
  const std::string& address(int host) const;
  /// Host `host`'s namespace name (for `ip netns exec`, `ip -n`).
  const std::string& netns(int host) const;
  /// The prefix every namespace of this bed starts with ("cdbed-<pid>-<k>-").
  const std::string& prefix() const noexcept { return prefix_; }
  /// The namespace names that start with `prefix` (from /var/run/netns).
  static std::vector<std::string> namespaces(const std::string& prefix);

  /// Forks a child process that enters host `host`'s network namespace
  /// (setns) and runs `body` there; as child_process, its exit code is
  /// body's return value (1 if it throws; 126 if the namespace cannot be
  /// entered). The child gets SIGKILL when the thread that called run()
  /// ends. Fork before this process starts threads (see child_process).
  std::unique_ptr<child_process> run(int host, std::function<int()> body) const;

  /// SIGKILL / SIGSTOP / SIGCONT to process `pid` (one that run() started).
  /// Throws std::runtime_error when kill() fails.
  static void kill9(pid_t pid);
  static void stop(pid_t pid);
  static void cont(pid_t pid);

  /// Takes host `host` off the network / puts it back (see the file comment).
  /// Throws std::runtime_error when the command fails.
  void link_down(int host);
  void link_up(int host);

  /// Drops host `host`'s traffic in direction `d` / lets it through again.
  /// Throws std::runtime_error when nft fails (not installed: scripts/setup.sh).
  void block(int host, direction d);
  void unblock(int host, direction d);

  /// Limits host `host`'s bandwidth to `bits_per_second` each way (tc tbf) /
  /// removes the limit. Throws std::runtime_error when tc fails.
  void limit(int host, std::uint64_t bits_per_second);
  void unlimit(int host);

  /// Deletes the namespaces of beds whose process is gone (names
  /// "cdbed-<pid>-..." with no such pid; a pid in use again keeps its
  /// leftovers until it ends); returns how many. The constructor calls it.
  static int sweep();

private:
  void check_host(int host) const;
  void ensure_nft_table();

  std::string prefix_;
  std::string switch_ns_;
  std::vector<std::string> hosts_;     // namespace names
  std::vector<std::string> addresses_; // IPv4 addresses
  bool nft_table_ = false;
};

} // namespace corodist::test
