// A rank for the launcher tests, started by corodist-run. Usage:
//   corodist-test-rank MODE_FOR_RANK_0 [MODE_FOR_RANK_1 ...]
// Rank R runs the R-th mode (the last one when there are fewer). Modes:
//   env                 print RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   output              "out 1" on stdout, "err 1" on stderr, then "tail" with no newline
//   exit:N              exit with status N
//   raise:N             raise signal N
//   wait-signal         print "ready", then on SIGTERM/SIGINT/SIGHUP print "got SIGxxx" and exit 0
//   ignore-term[:FIFO]  ignore SIGTERM, write a byte to FIFO (if given), print "ready", wait
//   fail-after:FIFO:N   read a byte from FIFO, then exit with status N
//   rendezvous          env:// rendezvous; print "rank R of W local L"; rank 0 leaves last
//   report              print "rank R of W gen G restart C node N" from the launcher's variables
//   rdzv-report[:N]     env:// rendezvous; print "rank R of W gen G restart C"; started with
//                       restart count 0 and given N: say so on stderr and exit with status N;
//                       else leave as `rendezvous` does
//   rdzv-hold[:N]       as rdzv-report, but instead of leaving print "holding" and wait
//                       for the key "release" in the rendezvous' store
//   rdzv-grow:N         env:// rendezvous; print "rank R of W gen G restart C"; in a world
//                       smaller than N print "holding" and wait to be stopped; else leave
//   stderr-exit:N:K     write "err line 0" .. "err line K-1" on stderr, then exit with status N
//   ft                  env:// rendezvous; print "rank R restart C pid P"; rank 0 of restart
//                       0 prints "ready" and waits (to be killed); rank 0 restarted sets the
//                       key "rejoined"; the others wait for that key and print "saw rank 0 rejoin"
//   answer-once         env:// rendezvous; wait until this rank's debug responder has
//                       answered the launcher's first ask (--timeline), print "answered", leave
// Every mode that waits gives up after 60 s (alarm), so nothing outlives a broken test.

#include <corodist/core/event_loop.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/sync_store.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

volatile std::sig_atomic_t got = 0;
extern "C" void on_signal(int sig) { got = sig; }

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// Waits until a signal handler has run (or SIGALRM ends us).
void wait_for_signal() {
  sigset_t none;
  sigemptyset(&none);
  while (got == 0)
    ::sigsuspend(&none);
}

namespace cs = corodist::store;

int restart_count() { return std::atoi(env_or("TORCHELASTIC_RESTART_COUNT", "0")); }

// Rank 0 leaves once every other rank has.
void leave(cs::sync_store& s, int rank, int world) {
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 1; r < world; ++r)
      keys.push_back("left/" + std::to_string(r));
    if (!keys.empty())
      s.wait(keys, std::chrono::seconds(20));
  } else {
    s.set("left/" + std::to_string(rank), "1");
  }
}

cs::rendezvous_options options() {
  cs::rendezvous_options o;
  o.timeout = std::chrono::seconds(20);
  o.auth_token = "";
  return o;
}

// rdzv-report and rdzv-hold.
int rendezvous_and_report(int fail_status, bool hold) {
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://", options());
  const int restarts = restart_count();
  std::printf("rank %d of %d gen %s restart %d\n", rank, world, env_or("CORODIST_GENERATION", "-"), restarts);
  std::fflush(stdout);
  if (fail_status != 0 && restarts == 0) {
    std::fprintf(stderr, "failing on purpose with status %d\n", fail_status);
    return fail_status;
  }
  cs::sync_store s(store);
  if (hold) {
    std::printf("holding\n");
    std::fflush(stdout);
    s.wait({"release"}, std::chrono::seconds(50));
    return 0;
  }
  leave(s, rank, world);
  return 0;
}

int grow(int want) {
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://", options());
  std::printf("rank %d of %d gen %s restart %d\n", rank, world, env_or("CORODIST_GENERATION", "-"), restart_count());
  std::fflush(stdout);
  if (world < want) {
    std::printf("holding\n");
    std::fflush(stdout);
    std::signal(SIGTERM, on_signal);
    wait_for_signal();
    return 0;
  }
  cs::sync_store s(store);
  leave(s, rank, world);
  return 0;
}

int fault_tolerant() {
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://", options());
  const int restarts = restart_count();
  std::printf("rank %d restart %d pid %d\n", rank, restarts, static_cast<int>(::getpid()));
  std::fflush(stdout);
  cs::sync_store s(store);
  if (rank == 0 && restarts == 0) {
    std::signal(SIGTERM, on_signal);
    std::printf("ready\n");
    std::fflush(stdout);
    wait_for_signal();
    return 0;
  }
  if (rank == 0) {
    s.set("rejoined", "1");
    return 0;
  }
  s.wait({"rejoined"}, std::chrono::seconds(50));
  std::printf("saw rank 0 rejoin\n");
  return 0;
}

int answer_once() {
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://", options());
  cs::sync_store s(store);
  s.wait({cs::debug_key("dump/" + std::to_string(rank) + "/1")}, std::chrono::seconds(50));
  std::printf("answered\n");
  std::fflush(stdout);
  return 0;
}

int rendezvous() {
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://", options());
  auto local = cs::local_rank_from_env();
  std::printf("rank %d of %d local %d\n", rank, world, local ? *local : -1);
  std::fflush(stdout);
  cs::sync_store s(store);
  if (rank == 0) { // leaves once every other rank has
    std::vector<std::string> keys;
    for (int r = 1; r < world; ++r)
      keys.push_back("left/" + std::to_string(r));
    if (!keys.empty())
      s.wait(keys, std::chrono::seconds(20));
  } else {
    s.set("left/" + std::to_string(rank), "1");
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: corodist-test-rank MODE...\n");
    return 2;
  }
  ::alarm(60);
  const int rank = std::atoi(env_or("RANK", "0"));
  const std::string mode = argv[std::min(1 + rank, argc - 1)];
  auto arg = [&](int i) {
    std::size_t pos = 0;
    for (int k = 0; k < i; ++k)
      pos = mode.find(':', pos) + 1;
    return mode.substr(pos, mode.find(':', pos) - pos);
  };
  if (mode == "env") {
    std::printf("R=%s W=%s L=%s LW=%s A=%s P=%s\n", env_or("RANK", "-"), env_or("WORLD_SIZE", "-"),
                env_or("LOCAL_RANK", "-"), env_or("LOCAL_WORLD_SIZE", "-"), env_or("MASTER_ADDR", "-"),
                env_or("MASTER_PORT", "-"));
    return 0;
  }
  if (mode == "output") {
    std::printf("out 1\n");
    std::fflush(stdout);
    std::fprintf(stderr, "err 1\n");
    std::printf("tail");
    return 0;
  }
  if (mode.rfind("exit:", 0) == 0)
    return std::atoi(arg(1).c_str());
  if (mode.rfind("raise:", 0) == 0) {
    std::signal(std::atoi(arg(1).c_str()), SIG_DFL);
    std::raise(std::atoi(arg(1).c_str()));
    return 0;
  }
  if (mode == "wait-signal") {
    for (int sig : {SIGTERM, SIGINT, SIGHUP})
      std::signal(sig, on_signal);
    std::printf("ready\n");
    std::fflush(stdout);
    wait_for_signal();
    std::printf("got SIG%s\n", ::sigabbrev_np(got));
    return 0;
  }
  if (mode.rfind("ignore-term", 0) == 0) {
    std::signal(SIGTERM, SIG_IGN);
    if (mode.size() > 11) {
      int fd = ::open(arg(1).c_str(), O_WRONLY);
      if (fd < 0 || ::write(fd, "x", 1) != 1)
        return 3;
      ::close(fd);
    }
    std::printf("ready\n");
    std::fflush(stdout);
    wait_for_signal();
    return 0;
  }
  if (mode.rfind("print-and-pause:", 0) == 0) {
    // A line on stdout through C stdio, not flushed, and one on stderr; then
    // the pid into the FIFO (the test kills us after reading it).
    std::printf("printed before the end\n");
    std::fprintf(stderr, "err before the end\n");
    int fd = ::open(arg(1).c_str(), O_WRONLY);
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (fd < 0 || ::write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size()))
      return 3;
    ::close(fd);
    for (;;)
      ::pause();
  }
  if (mode.rfind("fail-after:", 0) == 0) {
    int fd = ::open(arg(1).c_str(), O_RDONLY);
    char c;
    if (fd < 0 || ::read(fd, &c, 1) != 1)
      return 3;
    return std::atoi(arg(2).c_str());
  }
  if (mode == "report") {
    std::printf("rank %s of %s gen %s restart %s node %s\n", env_or("RANK", "-"), env_or("WORLD_SIZE", "-"),
                env_or("CORODIST_GENERATION", "-"), env_or("TORCHELASTIC_RESTART_COUNT", "-"),
                env_or("GROUP_RANK", "-"));
    return 0;
  }
  if (mode.rfind("stderr-exit:", 0) == 0) {
    const int lines = std::atoi(arg(2).c_str());
    for (int i = 0; i < lines; ++i)
      std::fprintf(stderr, "err line %d\n", i);
    return std::atoi(arg(1).c_str());
  }
  try {
    if (mode == "rendezvous")
      return rendezvous();
    if (mode.rfind("rdzv-report", 0) == 0 || mode.rfind("rdzv-hold", 0) == 0) {
      const bool hold = mode.rfind("rdzv-hold", 0) == 0;
      const int fail = mode.find(':') != std::string::npos ? std::atoi(arg(1).c_str()) : 0;
      return rendezvous_and_report(fail, hold);
    }
    if (mode.rfind("rdzv-grow:", 0) == 0)
      return grow(std::atoi(arg(1).c_str()));
    if (mode == "ft")
      return fault_tolerant();
    if (mode == "answer-once")
      return answer_once();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous failed: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "corodist-test-rank: unknown mode '%s'\n", mode.c_str());
  return 2;
}
