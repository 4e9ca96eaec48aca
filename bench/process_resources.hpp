#pragma once
/// \file
/// What the memory cases read about a process: its resident memory (and peak)
/// from /proc, and the open-file limit they raise before opening thousands of
/// connections; and what the exchange suites count: its thread wake-ups.
/// Linux only.

#include <sys/resource.h>
#include <sys/types.h>

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace corodist::bench {

/// Raises the soft open-file limit (RLIMIT_NOFILE) to the hard limit; the
/// connection cases need about two descriptors per connection in one process.
/// Returns the soft limit in force afterwards.
inline rlim_t raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

/// The hard open-file limit (RLIMIT_NOFILE): the most descriptors this
/// process (and what it starts) can ever have; raising it needs
/// CAP_SYS_RESOURCE. 0 if unknown.
inline rlim_t fd_hard_limit() {
  rlimit rl{};
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_max : 0;
}

/// The value of `field` ("VmRSS", "VmHWM", ...) in `/proc/<pid>/status`, in
/// bytes; `pid` 0 means this process. Throws std::runtime_error if absent.
inline long proc_status_bytes(const char* field, pid_t pid = 0) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  const std::string want = std::string(field) + ":";
  std::string key;
  while (f >> key)
    if (key == want) {
      long kb = 0;
      f >> kb;
      return kb * 1024;
    }
  throw std::runtime_error(std::string("no ") + field + " in /proc/" + (pid ? std::to_string(pid) : "self") +
                           "/status");
}

/// Resident memory of process `pid` (0: this process) in bytes (VmRSS).
inline long resident_bytes(pid_t pid = 0) { return proc_status_bytes("VmRSS", pid); }

/// CPU time (user + system, utime + stime of `/proc/<pid>/stat`) process
/// `pid` has used so far, in seconds. Throws std::runtime_error if unreadable.
inline double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto close = line.rfind(')'); // the command name may hold spaces and ')'
  if (close == std::string::npos)
    throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields; // fields[0] is field 3 (state)
  for (std::string w; rest >> w;)
    fields.push_back(w);
  if (fields.size() < 13)
    throw std::runtime_error("short /proc/" + std::to_string(pid) + "/stat");
  const double ticks = static_cast<double>(std::stoull(fields[11]) + std::stoull(fields[12])); // utime, stime
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// A TcpExt counter of this network namespace (`/proc/net/netstat`, e.g.
/// "ListenDrops", "ListenOverflows"); -1 if absent.
inline long tcp_ext_counter(const std::string& name) {
  std::ifstream f("/proc/net/netstat");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (!names.starts_with("TcpExt:"))
      continue;
    std::istringstream n(names), v(values);
    std::string key, value;
    while (n >> key && v >> value)
      if (key == name)
        return std::stol(value);
  }
  return -1;
}

/// The voluntary context switches of this process so far, all its threads
/// (getrusage's ru_nvcsw): each is a thread that went to sleep and had to be
/// woken up again.
inline long voluntary_switches() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw;
}

/// CPU time (user + system) this process, all its threads, has used so far,
/// in microseconds (getrusage).
inline double own_cpu_us() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// Resets this process's peak resident memory (VmHWM) to its current resident
/// memory (`echo 5 > /proc/self/clear_refs`, Linux 4.0+). Returns false if
/// the kernel refused.
inline bool reset_peak_resident() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

} // namespace corodist::bench
