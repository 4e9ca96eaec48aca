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
// Every mode that waits gives up after 60 s (alarm), so nothing outlives a broken test.

#include <corodist/core/event_loop.hpp>
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

int rendezvous() {
  namespace cs = corodist::store;
  corodist::event_loop loop;
  loop.start();
  cs::rendezvous_options o;
  o.timeout = std::chrono::seconds(20);
  o.auth_token = "";
  auto [store, rank, world] = cs::rendezvous(loop, "env://", o);
  auto local = cs::local_rank_from_env();
  std::printf("rank %d of %d local %d\n", rank, world, local ? *local : -1);
  std::fflush(stdout);
  cs::sync_store s(store);
  if (rank == 0) { // hosts the store: leaves once every other rank has
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
  if (mode.rfind("fail-after:", 0) == 0) {
    int fd = ::open(arg(1).c_str(), O_RDONLY);
    char c;
    if (fd < 0 || ::read(fd, &c, 1) != 1)
      return 3;
    return std::atoi(arg(2).c_str());
  }
  if (mode == "rendezvous") {
    try {
      return rendezvous();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvous failed: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "corodist-test-rank: unknown mode '%s'\n", mode.c_str());
  return 2;
}
