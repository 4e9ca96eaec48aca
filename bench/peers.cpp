#include "peers.hpp"

#include "subprocess.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <dirent.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {

namespace {

using clock_type = std::chrono::steady_clock;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string self_dir() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// A minimal reader for the flat objects the peers print: {"k": 1.5, "s": "text", ...}.
class flat_json {
public:
  explicit flat_json(std::string_view text) : t_(text) {}

  bool parse(peer_line& out) {
    skip();
    if (!eat('{')) return false;
    skip();
    if (eat('}')) return true;
    for (;;) {
      std::string key;
      if (!string(key)) return false;
      skip();
      if (!eat(':')) return false;
      skip();
      if (i_ < t_.size() && t_[i_] == '"') {
        std::string v;
        if (!string(v)) return false;
        out.strings[key] = v;
      } else {
        const char* begin = t_.data() + i_;
        char* end = nullptr;
        double v = std::strtod(begin, &end);
        if (end == begin) { // true/false/null: skip the word
          while (i_ < t_.size() && std::isalpha(static_cast<unsigned char>(t_[i_]))) ++i_;
        } else {
          out.numbers[key] = v;
          i_ += static_cast<std::size_t>(end - begin);
        }
      }
      skip();
      if (eat('}')) return true;
      if (!eat(',')) return false;
      skip();
    }
  }

private:
  void skip() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool eat(char c) {
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool string(std::string& out) {
    if (!eat('"')) return false;
    while (i_ < t_.size() && t_[i_] != '"') {
      if (t_[i_] == '\\' && i_ + 1 < t_.size()) ++i_;
      out.push_back(t_[i_++]);
    }
    return eat('"');
  }
  std::string_view t_;
  std::size_t i_ = 0;
};

} // namespace

double peer_line::number(const std::string& key) const {
  auto it = numbers.find(key);
  return it == numbers.end() ? not_applicable : it->second;
}

std::string peer_line::string(const std::string& key) const {
  auto it = strings.find(key);
  return it == strings.end() ? std::string() : it->second;
}

const peer_line* peer_output::find(const std::map<std::string, std::string>& match) const {
  for (const auto& l : lines) {
    bool all = true;
    for (const auto& [k, v] : match) all = all && l.string(k) == v;
    if (all) return &l;
  }
  return nullptr;
}

std::string bench_script(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("CORODIST_BENCH_DIR"); d && *d) dirs.emplace_back(d);
  dirs.emplace_back(CORODIST_BENCH_SOURCE_DIR);
  for (const auto& d : dirs)
    if (exists(d + "/" + name)) return d + "/" + name;
  return {};
}

std::string built_program(const std::string& relative) {
  auto p = self_dir() + "/../" + relative;
  return exists(p) ? p : std::string();
}

bool command_succeeds(const std::vector<std::string>& argv) {
  tools::spawn_options o;
  o.argv = argv;
  int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  o.stdout_fd = devnull;
  o.stderr_fd = devnull;
  int status = -1;
  try {
    pid_t pid = tools::spawn(o);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } catch (const std::exception&) {
  }
  ::close(devnull);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::optional<std::string> torch_unavailable() {
  static std::once_flag once;
  static std::optional<std::string> why;
  std::call_once(once, [] {
    if (!exists("/usr/bin/python3") || !command_succeeds({"/usr/bin/python3", "-c", "import torch.distributed.rpc"}))
      why = "not installed";
  });
  return why;
}

void remove_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        remove_tree(path + "/" + e->d_name);
    ::closedir(d);
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

peer_output run_peer(context& ctx, const std::string& what, const std::vector<std::string>& argv,
                     std::chrono::seconds timeout) {
  peer_output result;
  if (ctx.status != nullptr) ctx.status->note("peer " + what);
  tools::pipe_fds out, err;
  tools::spawn_options o;
  o.argv = argv;
  o.stdout_fd = out.write_end();
  o.stderr_fd = err.write_end();
  o.new_process_group = true;
  o.die_with_parent = true;
  pid_t pid = -1;
  try {
    pid = tools::spawn(o);
  } catch (const std::exception& e) {
    result.failure = "not installed";
    return result;
  }
  out.close_write();
  err.close_write();
  std::string out_text, err_text;
  const auto deadline = clock_type::now() + timeout;
  bool timed_out = false;
  int open_fds = 2;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{out.read_end(), POLLIN, 0}, {err.read_end(), POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[8192];
      auto r = ::read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        i == 0 ? out.close_read() : err.close_read();
        --open_fds;
      } else {
        (i == 0 ? out_text : err_text).append(buf, static_cast<std::size_t>(r));
      }
    }
  }
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::kill(-pid, SIGKILL); // anything it left behind
  std::size_t pos = 0;
  while (pos < out_text.size()) {
    auto nl = out_text.find('\n', pos);
    std::string_view line(out_text.data() + pos, (nl == std::string::npos ? out_text.size() : nl) - pos);
    pos = nl == std::string::npos ? out_text.size() : nl + 1;
    if (!line.empty() && line.front() == '[') // corodist-run's "[R] " prefix
      if (auto close = line.find("] "); close != std::string_view::npos) line.remove_prefix(close + 2);
    if (line.empty() || line.front() != '{') continue;
    peer_line parsed;
    if (flat_json(line).parse(parsed)) result.lines.push_back(std::move(parsed));
  }
  if (timed_out || !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    auto tail = err_text.size() > 400 ? err_text.substr(err_text.size() - 400) : err_text;
    for (auto& c : tail)
      if (c == '\n') c = ' ';
    result.failure = timed_out ? fmt::format("failed: timed out after {} s", timeout.count())
                               : "failed: " + tools::describe_wait_status(status);
    fmt::print(stderr, "corodist-bench: peer {} {}: {}\n", what, result.failure, tail);
  }
  return result;
}

peer_result peer_from(const std::string& name, const peer_output& out, const std::map<std::string, std::string>& match,
                      const char* p50_key, const char* ops_key, const char* gbytes_key) {
  const peer_line* l = out.find(match);
  if (l == nullptr) return peer_result::missing(name, out.failure.empty() ? "failed: no result" : out.failure);
  peer_result p;
  p.name = name;
  if (p50_key) p.p50_us = l->number(p50_key);
  if (ops_key) p.ops_per_s = l->number(ops_key);
  if (gbytes_key) p.gbytes_per_s = l->number(gbytes_key);
  return p;
}

} // namespace corodist::bench
