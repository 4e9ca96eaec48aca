#pragma once
/// \file
/// Jobs that take turns on one machine: a suite's rank processes (forked from
/// the benchmark) and a peer's (a script started as a child process), each
/// driven over two pipes one line at a time, so that the suite can run them
/// block by block on each size and both see the same machine (this VM's other
/// tenants come and go). Used by the allreduce, p2p and all_to_all suites.
///
/// The protocol, one line each way: the job prints "READY" once its ranks
/// have met; "RUN <words...>" runs one block (the words are the suite's) and
/// is answered "DONE"; "QUIT" is answered with the job's result lines, then
/// end of file.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace corodist::bench {

/// Reads lines from a descriptor, each within a deadline.
class line_reader {
public:
  /// Reads `fd` (not owned); `suite` names the suite in errors.
  line_reader(int fd, std::string suite) : fd_(fd), suite_(std::move(suite)) {}

  /// The next line (without its newline), or nullopt at end of file; throws
  /// std::runtime_error naming `what` after `timeout`.
  std::optional<std::string> next(std::chrono::milliseconds timeout, const std::string& what);

private:
  int fd_;
  std::string suite_;
  std::string buf_;
};

/// Writes `line` and a newline to `fd`; throws std::runtime_error naming
/// `suite` when the pipe is closed.
void write_line(int fd, const std::string& line, const std::string& suite);

/// Waits for child `pid` (retrying EINTR); returns its exit status, or 128 +
/// the signal that ended it.
int wait_child(pid_t pid);

/// A job of processes driven over a control pipe (its stdin, or rank 0's
/// control descriptor) and an output pipe. Destroying an unfinished job kills
/// its processes (SIGKILL) and reaps them.
class turn_job {
public:
  /// Owns `control` (written) and `output` (read) and the processes `pids`;
  /// `suite` and `name` (e.g. "PyTorch's 4 ranks") go into errors.
  turn_job(std::string suite, std::string name, std::vector<pid_t> pids, int control, int output);
  turn_job(const turn_job&) = delete;
  turn_job& operator=(const turn_job&) = delete;
  ~turn_job();

  /// Waits (up to 2 minutes) for the job's "READY".
  void ready();

  /// Runs one block: sends "RUN <words>" and waits (up to `timeout`) for "DONE".
  void run(const std::string& words, std::chrono::milliseconds timeout = std::chrono::minutes(5));

  /// Ends the job ("QUIT"): returns every line it printed until end of file,
  /// then reaps its processes; throws std::runtime_error when one failed.
  std::vector<std::string> finish(std::chrono::milliseconds timeout = std::chrono::minutes(5));

  /// The name given at construction.
  const std::string& name() const noexcept { return name_; }

private:
  void expect(const std::string& word, std::chrono::milliseconds timeout);

  std::string suite_;
  std::string name_;
  std::vector<pid_t> pids_;
  int control_;
  int output_;
  line_reader reader_;
};

/// Forks `n` rank processes of a job; rank r runs `body(r, control_fd,
/// output_fd)` and exits with its value (1 if it throws: the error goes to
/// stderr). Only rank 0 should read `control_fd` and write `output_fd` (it
/// passes the commands on to the others). The processes die with the
/// benchmark (PR_SET_DEATHSIG).
std::unique_ptr<turn_job> fork_job(const std::string& suite, const std::string& name, int n,
                                   const std::function<int(int rank, int control_fd, int output_fd)>& body);

/// Starts `argv` (argv[0] a path) with its stdin and stdout on the job's pipes.
std::unique_ptr<turn_job> spawn_job(const std::string& suite, const std::string& name,
                                    const std::vector<std::string>& argv);

/// Words of a "RESULT ..." line after the word "RESULT", as numbers ("nan"
/// read as NaN); nullopt for another line or a word that is not a number.
std::optional<std::vector<double>> result_words(const std::string& line);

} // namespace corodist::bench
