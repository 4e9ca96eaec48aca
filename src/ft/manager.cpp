#include <corodist/ft/manager.hpp>

#include "core/log.hpp"
#include "ft/quorum_round.hpp"

#include <corodist/collective/errors.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/error.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <algorithm>
#include <random>

namespace corodist::ft {

struct manager::impl {
  std::shared_ptr<store::store> store;
  manager_options opts;
  detail::round_keys keys;
  member self;
  std::vector<std::pair<std::string, collective::tensor_view>> state;
  std::optional<detail::decided_round> round; // the last decided round
  quorum q;
  std::shared_ptr<collective::process_group> group;
  bool needs_group = true; // no group, or the last step failed
  bool in_step = false;

  impl(std::shared_ptr<store::store> s, manager_options o)
      : store(std::move(s)), opts(std::move(o)), keys(opts.prefix) {}

  detail::round_setup context() const {
    return {store, keys, opts.poll_interval, opts.min_replicas,
            opts.initial_replicas > 0 ? opts.initial_replicas : opts.min_replicas,
            opts.quorum_timeout.from().at()};
  }

  quorum describe(const detail::decided_round& d) const {
    quorum out;
    out.id = d.id;
    for (const auto& l : d.members) {
      if (detail::same(l.m, self)) out.rank = static_cast<int>(out.members.size());
      out.max_step = std::max(out.max_step, l.m.step);
      out.members.push_back(l.m);
      auto was = std::any_of(d.previous.begin(), d.previous.end(),
                             [&](const detail::member_line& p) { return detail::same(p.m, l.m); });
      if (!was) out.joined.push_back(l.m.replica_id);
    }
    for (const auto& p : d.previous) {
      auto is = std::any_of(d.members.begin(), d.members.end(),
                            [&](const detail::member_line& l) { return detail::same(p.m, l.m); });
      if (!is) out.left.push_back(p.m.replica_id);
    }
    return out;
  }

  // What make_group receives: the previous group, and which of its ranks
  // were lost when no replica joined.
  group_spec group_spec_for(const detail::decided_round& d, const quorum& q) const {
    group_spec r;
    r.store = store;
    r.rank = q.rank;
    r.size = q.size();
    r.prefix = keys.group(d.id);
    r.previous = group;
    r.subset_of_previous = group && q.joined.empty() && group->size() == static_cast<int>(d.previous.size());
    for (int i = 0; r.subset_of_previous && i < static_cast<int>(d.previous.size()); ++i)
      if (std::none_of(d.members.begin(), d.members.end(),
                       [&](const detail::member_line& l) { return detail::same(l.m, d.previous[i].m); }))
        r.lost.push_back(i);
    r.options = opts.group;
    r.options.prefix = r.prefix;
    return r;
  }

  asio::awaitable<std::shared_ptr<collective::process_group>> form_group(const group_spec& r) {
    std::shared_ptr<collective::process_group> g;
    if (opts.make_group)
      g = co_await opts.make_group(r);
    else
      g = co_await collective::gloo_group::create(r.store, r.rank, r.size, r.options);
    if (!g || g->rank() != r.rank || g->size() != r.size)
      throw usage_error("ft::manager: make_group returned no group, or one of another rank or size");
    co_return g;
  }
};

namespace {

void check_id(const std::string& id) {
  if (id.empty() || id.size() > 128 ||
      std::any_of(id.begin(), id.end(), [](char c) { return c == ' ' || c == '\n' || c == '/' || c == '\0'; }))
    throw usage_error("ft::manager: replica_id must be 1 to 128 bytes without blanks, newlines or '/': '" + id + "'");
}

std::uint64_t draw_incarnation() {
  std::random_device rd;
  std::uint64_t v = 0;
  while (v == 0) v = (std::uint64_t{rd()} << 32) ^ rd();
  return v;
}

} // namespace

asio::awaitable<std::unique_ptr<manager>> manager::create(std::shared_ptr<store::store> store, manager_options opts) {
  if (!store) throw usage_error("ft::manager: no store");
  check_id(opts.replica_id);
  if (opts.min_replicas < 1) throw usage_error("ft::manager: min_replicas must be at least 1");
  if (opts.initial_replicas < 0) throw usage_error("ft::manager: initial_replicas must not be negative");
  opts.quorum_timeout = opts.quorum_timeout.or_else(manager_options::default_quorum_timeout);
  if ((opts.quorum_timeout.is_finite() && opts.quorum_timeout.length() <= std::chrono::milliseconds(0)) ||
      opts.poll_interval <= std::chrono::milliseconds(0))
    throw usage_error("ft::manager: quorum_timeout and poll_interval must be positive");
  auto i = std::make_unique<impl>(std::move(store), std::move(opts));
  i->self.replica_id = i->opts.replica_id;
  i->self.incarnation = draw_incarnation();
  co_await i->store->set_owned(i->keys.alive(i->self), "");
  CORODIST_LOG_DEBUG("ft: replica '{}' registered (incarnation {})", i->self.replica_id, i->self.incarnation);
  co_return std::unique_ptr<manager>(new manager(std::move(i)));
}

manager::manager(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

manager::~manager() {
  if (!impl_) return;
  impl_->group.reset();
  // Leave at once rather than when the store connection closes: the others
  // then stop waiting for this replica.
  try {
    asio::co_spawn(impl_->store->get_executor(),
                   [](std::shared_ptr<store::store> s, std::string key) -> asio::awaitable<void> {
                     try {
                       co_await s->delete_key(std::move(key));
                     } catch (const std::exception&) {
                     }
                   }(impl_->store, impl_->keys.alive(impl_->self)),
                   asio::detached);
  } catch (const std::exception&) {
  }
}

void manager::register_state(std::string name, collective::tensor_view buffer) {
  if (impl_->round) throw usage_error("ft::manager: register_state('" + name + "') after the first step");
  if (buffer.where().kind != collective::device::kind_type::cpu)
    throw usage_error("ft::manager: register_state('" + name + "'): only host buffers are supported");
  impl_->state.emplace_back(std::move(name), buffer);
}

asio::awaitable<quorum> manager::start_step() {
  auto& m = *impl_;
  if (m.in_step) throw usage_error("ft::manager: start_step() twice without should_commit()");
  auto ctx = m.context();
  for (;;) {
    detail::member_line line{m.self, m.needs_group || !m.group || m.group->aborted()};
    line.m.step = m.self.step;
    detail::decided_round d;
    if (m.round)
      d = co_await detail::member_round(ctx, *m.round, line);
    else
      d = co_await detail::join_round(ctx, line);
    m.round = d;
    auto q = m.describe(d);
    bool changed = d.members.size() != d.previous.size() || !q.joined.empty();
    q.reconfigured = changed || std::any_of(d.members.begin(), d.members.end(),
                                            [](const detail::member_line& l) { return l.needs_group; });
    bool behind = d.previous.empty() || !q.joined.empty() ||
                  std::any_of(q.members.begin(), q.members.end(),
                              [&](const member& x) { return x.step != q.max_step; });
    std::string failure;
    try {
      if (q.reconfigured) {
        auto request = m.group_spec_for(d, q);
        m.group.reset();
        m.group = co_await m.form_group(request);
      }
      if (behind) {
        for (int i = 0; i < q.size(); ++i)
          if (q.members[i].step == q.max_step) {
            q.source = i;
            break;
          }
        for (auto& [name, view] : m.state) co_await m.group->broadcast(view, q.source);
        q.recovered = true;
        m.self.step = q.max_step;
      }
    } catch (const collective::collective_failure& e) {
      failure = dynamic_cast<const std::exception&>(e).what();
    } catch (const timeout_error& e) {
      failure = e.what();
    }
    if (failure.empty()) {
      m.needs_group = false;
      m.in_step = true;
      m.q = std::move(q);
      co_return m.q;
    }
    // A member was lost while the group formed or the state travelled: the
    // next round goes on without it.
    CORODIST_LOG_WARN("ft: replica '{}': round {} failed, trying the next one: {}", m.self.replica_id, d.id, failure);
    m.needs_group = true;
    m.group.reset();
  }
}

asio::awaitable<bool> manager::should_commit(bool ok) {
  auto& m = *impl_;
  if (!m.in_step) throw usage_error("ft::manager: should_commit() without start_step()");
  m.in_step = false;
  ok = ok && m.group && !m.group->aborted();
  auto ctx = m.context();
  bool committed = co_await detail::commit_round(ctx, *m.round, m.self, ok);
  if (committed)
    ++m.self.step;
  else
    m.needs_group = true;
  co_return committed;
}

std::shared_ptr<collective::process_group> manager::group() const noexcept { return impl_->group; }
std::uint64_t manager::step() const noexcept { return impl_->self.step; }
const quorum& manager::current() const noexcept { return impl_->q; }
const std::string& manager::replica_id() const noexcept { return impl_->self.replica_id; }

} // namespace corodist::ft
