#pragma once
/// \file
/// What the memory cases read about a process: its resident memory (and peak)
/// from /proc, and the open-file limit they raise before opening thousands of
/// connections. Linux only.

#include <sys/resource.h>
#include <sys/types.h>

#include <fstream>
#include <stdexcept>
#include <string>

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
