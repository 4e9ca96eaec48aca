#include "subprocess.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string_view>
#include <system_error>

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace corodist::tools {

namespace {

// Our environment with `overrides` set on top, as "KEY=VALUE" strings.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    auto key = entry.substr(0, eq);
    bool replaced = false;
    for (auto& [k, v] : overrides)
      replaced = replaced || k == key;
    if (!replaced)
      env.emplace_back(entry);
  }
  for (auto& [k, v] : overrides)
    env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  p.reserve(strings.size() + 1);
  for (auto& s : strings)
    p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// In the child, between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const spawn_options& o, char* const* argv, char* const* envp, int error_fd,
                             pid_t parent) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP)
      ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int err = 0;
  if (o.new_process_group && ::setpgid(0, 0) != 0)
    err = errno;
  if (!err && o.die_with_parent) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
      err = errno;
    else if (::getppid() != parent) // the parent died before prctl
      ::_exit(127);
  }
  const int targets[3] = {o.stdin_fd, o.stdout_fd, o.stderr_fd};
  for (int fd = 0; fd < 3 && !err; ++fd)
    if (targets[fd] >= 0 && targets[fd] != fd && ::dup2(targets[fd], fd) < 0)
      err = errno;
  if (!err && o.close_other_fds)
    ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC); // best effort: old kernels lack it
  if (!err) {
    ::execvpe(argv[0], argv, envp);
    err = errno;
  }
  while (::write(error_fd, &err, sizeof err) < 0 && errno == EINTR) {
  }
  ::_exit(127);
}

} // namespace

pid_t spawn(const spawn_options& o) {
  if (o.argv.empty() || o.argv[0].empty())
    throw std::system_error(std::make_error_code(std::errc::invalid_argument), "spawn: no program given");
  std::vector<std::string> args = o.argv;
  std::vector<std::string> env = child_environment(o.env);
  auto argv = pointers(args);
  auto envp = pointers(env);
  pipe_fds report; // close-on-exec: EOF at a successful exec, an errno otherwise
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    throw std::system_error(errno, std::generic_category(), "spawn: fork");
  if (pid == 0)
    exec_child(o, argv.data(), envp.data(), report.write_end(), parent);
  report.close_write();
  int err = 0;
  ssize_t n;
  while ((n = ::read(report.read_end(), &err, sizeof err)) < 0 && errno == EINTR) {
  }
  if (n == 0)
    return pid;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  throw std::system_error(n == sizeof err ? err : EIO, std::generic_category(), "cannot execute '" + o.argv[0] + "'");
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status))
    return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
  }
  return "wait status " + std::to_string(status);
}

pipe_fds::pipe_fds() {
  if (::pipe2(fds_, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
}

pipe_fds::~pipe_fds() {
  close_read();
  close_write();
}

void pipe_fds::close_read() noexcept {
  if (fds_[0] >= 0)
    ::close(std::exchange(fds_[0], -1));
}

void pipe_fds::close_write() noexcept {
  if (fds_[1] >= 0)
    ::close(std::exchange(fds_[1], -1));
}

} // namespace corodist::tools
