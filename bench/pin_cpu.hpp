#pragma once
/// \file
/// The benchmarks' --pin: every thread of the process on one CPU (corodist-bench
/// and the coro_rpc peer, which is built outside Meson: standard C++ and POSIX only).

#include <sched.h>
#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace corodist::bench {

/// Pins every thread of the process to one CPU (CPU 0, or the lowest CPU it
/// may use if 0 is outside its affinity mask). Threads created later inherit
/// it. Returns the CPU, or -1 with a message on stderr that starts with
/// `program`.
inline int pin_process_to_one_cpu(const char* program) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    std::fprintf(stderr, "%s: sched_getaffinity: %s\n", program, std::strerror(errno));
    return -1;
  }
  int cpu = -1;
  for (int c = 0; c < CPU_SETSIZE && cpu < 0; ++c)
    if (CPU_ISSET(c, &allowed))
      cpu = c;
  if (cpu < 0)
    return -1;
  if (cpu != 0)
    std::fprintf(stderr, "%s: CPU 0 not available, pinning to CPU %d\n", program, cpu);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (::sched_setaffinity(0, sizeof one, &one) != 0) {
    std::fprintf(stderr, "%s: sched_setaffinity: %s\n", program, std::strerror(errno));
    return -1;
  }
  // sched_setaffinity(0) covers the calling thread only: pin any thread that
  // already exists (e.g. started by a static initialiser) as well.
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(dir)) {
      const int tid = std::atoi(entry->d_name);
      if (tid > 0)
        ::sched_setaffinity(tid, sizeof one, &one);
    }
    ::closedir(dir);
  }
  return cpu;
}

} // namespace corodist::bench
