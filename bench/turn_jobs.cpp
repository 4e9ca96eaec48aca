#include "turn_jobs.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace corodist::bench {

using clock_type = std::chrono::steady_clock;

std::optional<std::string> line_reader::next(std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    if (auto nl = buf_.find('\n'); nl != std::string::npos) {
      auto line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    if (left <= 0)
      throw std::runtime_error(fmt::format("{}: no answer from {} in time", suite_, what));
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<long>(left, 1000))) <= 0)
      continue;
    char chunk[4096];
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n <= 0) {
      if (buf_.empty())
        return std::nullopt;
      return std::exchange(buf_, {});
    }
    buf_.append(chunk, static_cast<std::size_t>(n));
  }
}

void write_line(int fd, const std::string& line, const std::string& suite) {
  const std::string l = line + "\n";
  if (::write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
    throw std::runtime_error(suite + ": a job's control pipe is closed");
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

turn_job::turn_job(std::string suite, std::string name, std::vector<pid_t> pids, int control, int output)
    : suite_(std::move(suite)), name_(std::move(name)), pids_(std::move(pids)), control_(control), output_(output),
      reader_(output, suite_) {}

turn_job::~turn_job() {
  if (!pids_.empty()) {
    for (auto pid : pids_)
      ::kill(pid, SIGKILL);
    for (auto pid : pids_)
      wait_child(pid);
  }
  ::close(control_);
  ::close(output_);
}

void turn_job::ready() { expect("READY", std::chrono::minutes(2)); }

void turn_job::run(const std::string& words, std::chrono::milliseconds timeout) {
  write_line(control_, "RUN " + words, suite_);
  expect("DONE", timeout);
}

std::vector<std::string> turn_job::finish(std::chrono::milliseconds timeout) {
  write_line(control_, "QUIT", suite_);
  std::vector<std::string> lines;
  while (auto line = reader_.next(timeout, name_))
    lines.push_back(std::move(*line));
  int failed = 0;
  for (auto pid : pids_)
    failed += wait_child(pid) != 0;
  pids_.clear();
  if (failed)
    throw std::runtime_error(fmt::format("{}: {} process(es) of {} failed", suite_, failed, name_));
  return lines;
}

void turn_job::expect(const std::string& word, std::chrono::milliseconds timeout) {
  for (;;) {
    auto line = reader_.next(timeout, name_);
    if (!line)
      throw std::runtime_error(fmt::format("{}: {} ended early", suite_, name_));
    if (*line == word)
      return;
  }
}

std::unique_ptr<turn_job> fork_job(const std::string& suite, const std::string& name, int n,
                                   const std::function<int(int rank, int control_fd, int output_fd)>& body) {
  int control[2], output[2];
  if (::pipe(control) != 0)
    throw std::runtime_error(suite + ": pipe failed");
  if (::pipe(output) != 0) {
    ::close(control[0]);
    ::close(control[1]);
    throw std::runtime_error(suite + ": pipe failed");
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (auto p : pids)
        ::kill(p, SIGKILL);
      for (auto p : pids)
        wait_child(p);
      for (int fd : {control[0], control[1], output[0], output[1]})
        ::close(fd);
      throw std::runtime_error(suite + ": fork failed");
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL); // no rank outlives a benchmark that died
      ::close(control[1]);
      ::close(output[0]);
      int rc = 1;
      try {
        rc = body(r, control[0], output[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d: %s\n", suite.c_str(), r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  ::close(control[0]);
  ::close(output[1]);
  return std::make_unique<turn_job>(suite, name, std::move(pids), control[1], output[0]);
}

std::unique_ptr<turn_job> spawn_job(const std::string& suite, const std::string& name,
                                    const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (::pipe(in) != 0)
    throw std::runtime_error(suite + ": pipe failed");
  if (::pipe(out) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    throw std::runtime_error(suite + ": pipe failed");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  for (int fd : {in[0], in[1], out[0], out[1]})
    posix_spawn_file_actions_addclose(&fa, fd);
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    throw std::runtime_error(suite + ": cannot start " + argv.at(0));
  }
  return std::make_unique<turn_job>(suite, name, std::vector<pid_t>{pid}, in[1], out[0]);
}

std::optional<std::vector<double>> result_words(const std::string& line) {
  std::istringstream in(line);
  std::string tag;
  if (!(in >> tag) || tag != "RESULT")
    return std::nullopt;
  std::vector<double> v; // strtod: unlike operator>>, it reads "nan"
  for (std::string word; in >> word;) {
    char* end = nullptr;
    const double x = std::strtod(word.c_str(), &end);
    if (end == word.c_str() || *end != '\0')
      return std::nullopt;
    v.push_back(x);
  }
  return v;
}

} // namespace corodist::bench
