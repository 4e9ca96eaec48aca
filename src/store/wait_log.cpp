#include "store/wait_log.hpp"

#include "core/log.hpp"

namespace corodist::store::detail {

struct wait_log::state : std::enable_shared_from_this<state> {
  state(asio::any_io_executor ex, std::string w, std::chrono::milliseconds e)
      : timer(std::move(ex)), where(std::move(w)), every(e) {}

  void add(entry& e) {
    e.next_ = head;
    if (head)
      head->prev_ = &e;
    head = &e;
    e.due_ = e.since_ + every;
    if (!armed) // an armed timer fires no later than the newcomer's first warning is due
      arm(e.due_);
  }

  void remove(entry& e) {
    if (e.prev_)
      e.prev_->next_ = e.next_;
    else
      head = e.next_;
    if (e.next_)
      e.next_->prev_ = e.prev_;
  }

  void arm(std::chrono::steady_clock::time_point at) {
    armed = true;
    timer.expires_at(at);
    timer.async_wait([w = weak_from_this()](std::error_code ec) {
      if (auto self = w.lock())
        self->tick(ec);
    });
  }

  void tick(std::error_code ec) {
    armed = false;
    if (ec || !head)
      return; // armed again by the next long wait
    const auto now = std::chrono::steady_clock::now();
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto* e = head; e; e = e->next_) {
      if (e->due_ <= now) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - e->since_);
        CORODIST_LOG_WARN("store: still waiting for {} {} at {} after {} ({})", e->keys_.size() == 1 ? "key" : "keys",
                          key_list(e->keys_), where, duration_text(waited),
                          e->timeout_.count() > 0 ? "gives up after " + duration_text(e->timeout_) : "no deadline");
        e->due_ += every;
      }
      next = std::min(next, e->due_);
    }
    arm(next);
  }

  asio::steady_timer timer;
  std::string where;
  std::chrono::milliseconds every;
  entry* head = nullptr;
  bool armed = false;
};

wait_log::wait_log(asio::any_io_executor ex, std::string where, std::chrono::milliseconds every)
    : state_(std::make_shared<state>(std::move(ex), std::move(where), every)) {}

wait_log::~wait_log() { state_->timer.cancel(); }

wait_log::entry::entry(wait_log& log, std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0 && timeout <= log.state_->every)
    return;
  state_ = log.state_.get();
  keys_ = keys;
  timeout_ = timeout;
  since_ = std::chrono::steady_clock::now();
  state_->add(*this);
}

wait_log::entry::~entry() {
  if (state_)
    state_->remove(*this);
}

std::string key_list(std::span<const std::string> keys, std::size_t max) {
  std::string m;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == max) {
      m += ", ... (" + std::to_string(keys.size()) + " in all)";
      break;
    }
    m += (i ? ", " : "") + keys[i];
  }
  return m;
}

std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() >= 10'000)
    return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

} // namespace corodist::store::detail
