#include "launcher.hpp"
#include "output.hpp"
#include "signals.hpp"

#include <exception>

namespace corodist::tools::launch {

namespace cs = corodist::store;

int launcher::run() {
  install_signal_handlers();

  loop_.start();
  int code = 1;
  try {
    open_store();
    code = run_generations();
  } catch (const stopped_by_signal& st) {
    say("stopped by " + signal_name(st.sig));
    code = 128 + st.sig;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (!host_ && store_ && dynamic_cast<const corodist::connection_error*>(&e))
      what = "lost the job's store at " + store_address() + " (the launcher of node 0 hosts it: has it ended?): " +
             what;
    say(what);
    code = 1;
  }
  close_store();
  return code;
}

int launcher::run_generations() {
  for (;;) {
    if (!join_round())
      return 0; // the job ended while this node waited to join
    restart_count_ = assignment_.restart_count;
    if (s_.elastic || generation_ > 0)
      say("generation " + std::to_string(generation_) + ": node " + std::to_string(assignment_.node_rank) + " of " +
          std::to_string(assignment_.nodes) + ", ranks " + std::to_string(assignment_.rank_base) + ".." +
          std::to_string(assignment_.rank_base + s_.nproc - 1) + " of " + std::to_string(assignment_.world));
    const auto end = supervise_generation();
    if (auto code = decide(end))
      return *code;
    if (!split_word(end).first.starts_with("admit"))
      ++restart_count_;
    ++generation_;
  }
}

// Sets the generation's end (the first setter wins); a lost store ends it too.
void launcher::set_end(const std::string& value) {
  try {
    (void)sync_->compare_set(end_key(), "", value);
  } catch (const std::exception& e) {
    if (!end_)
      end_ = std::string("lost ") + e.what();
  }
}

// What to do once a generation has ended: an exit status, or nullopt to start the next.
std::optional<int> launcher::decide(const std::string& end) {
  auto [word, rest] = split_word(end);
  if (word == "done")
    return 0;
  if (word == "restart") {
    std::string line = rest + ": restarting the workers of every node under generation " +
                       std::to_string(generation_ + 1) + " (restart " + std::to_string(restart_count_ + 1) + " of " +
                       std::to_string(s_.max_restarts) + ")";
    say(line);
    failure_.reset();
    return std::nullopt;
  }
  if (word == "admit") {
    say(rest + ": restarting the workers of every node under generation " + std::to_string(generation_ + 1) +
        " (not counted as a restart)");
    failure_.reset();
    return std::nullopt;
  }
  if (word == "failed" || word == "stopped") {
    auto [code_text, text] = split_word(rest);
    const int code = to_int(code_text);
    if (word == "stopped" && stop_signal_) {
      say("stopped by " + signal_name(*stop_signal_));
      return 128 + *stop_signal_;
    }
    if (word == "failed" && failure_) {
      report_failure();
      return code != 0 ? code : 1;
    }
    say("the job ended: " + text + "; this node's workers were stopped");
    return code != 0 ? code : 1;
  }
  if (word == "lost") {
    say("lost the job's store at " + store_address() + " (the launcher of node 0 hosts it: has it ended?): " + rest +
        "; this node's workers were stopped");
    return 1;
  }
  throw launch_error("unexpected end of generation " + std::to_string(generation_) + ": '" + end + "'");
}

void launcher::report_failure() {
  auto& f = *failure_;
  std::string line = "rank " + std::to_string(f.rank);
  if (f.pid > 0)
    line += " (pid " + std::to_string(f.pid) + ")";
  line += " failed: " + f.what;
  int others = 0;
  for (auto& r : ranks_)
    others += r.rank != f.rank && r.pid > 0;
  if (others > 0 || assignment_.nodes > 1)
    line += "; the other ranks were stopped";
  if (s_.max_restarts > 0)
    line += "; restarts spent (" + std::to_string(s_.max_restarts) + ")";
  say(line);
  if (!f.tail.empty()) {
    say("the last " + std::to_string(f.tail.size()) + " lines of rank " + std::to_string(f.rank) + "'s stderr:");
    for (auto& l : f.tail)
      say("  [" + std::to_string(f.rank) + "] " + l);
  }
}
} // namespace corodist::tools::launch
