#pragma once
/// \file
/// Private to corodist's tools and tests: start a program as a child process
/// (fork + exec) with chosen file descriptors, extra environment variables and
/// its own process group, and describe how a child ended. Used by
/// `corodist-run` and by the tests' `program` helper; not installed.

#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

namespace corodist::tools {

/// How to start a child: what to run, with which descriptors and environment.
struct spawn_options {
  /// The program and its arguments; argv[0] is looked up in PATH when it has no '/'.
  std::vector<std::string> argv;
  /// Variables set (or replaced) in the child's environment, on top of ours.
  std::vector<std::pair<std::string, std::string>> env;
  /// The child's stdin, stdout and stderr: a descriptor to dup2 onto 0/1/2,
  /// or -1 to inherit ours.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  /// Puts the child in a process group of its own (pgid = pid), so that
  /// `kill(-pid, sig)` reaches it and everything it starts.
  bool new_process_group = false;
  /// The child gets SIGKILL if the thread that started it dies (PR_SET_PDEATHSIG).
  bool die_with_parent = false;
  /// Every descriptor of ours above 2 is closed in the child at exec
  /// (close_range with CLOSE_RANGE_CLOEXEC; a kernel without it leaves them),
  /// so that sockets opened without close-on-exec (Asio's) are not inherited.
  bool close_other_fds = false;
};

/// Forks and execs `o.argv` with signal dispositions and mask reset to the
/// defaults; returns the child's pid once exec has succeeded. Throws
/// std::system_error when fork fails or the program cannot be executed
/// (the message names the program and the exec error); the failed child is
/// reaped before that. Only async-signal-safe calls run between fork and exec,
/// so it may be called from a multi-threaded process.
pid_t spawn(const spawn_options& o);

/// "exit status N" or "killed by signal N (SIGNAME)" for a waitpid() status.
std::string describe_wait_status(int status);

/// A pipe with both ends close-on-exec; each end closes at scope exit.
class pipe_fds {
public:
  /// Creates the pipe; throws std::system_error when pipe2 fails.
  pipe_fds();
  ~pipe_fds();
  pipe_fds(const pipe_fds&) = delete;
  pipe_fds& operator=(const pipe_fds&) = delete;

  /// The read end (-1 once closed).
  int read_end() const noexcept { return fds_[0]; }
  /// The write end (-1 once closed).
  int write_end() const noexcept { return fds_[1]; }
  /// Closes the read end (no-op if closed).
  void close_read() noexcept;
  /// Closes the write end (no-op if closed).
  void close_write() noexcept;

private:
  int fds_[2] = {-1, -1};
};

} // namespace corodist::tools
