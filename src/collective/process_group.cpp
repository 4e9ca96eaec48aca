#include <corodist/collective/process_group.hpp>
#include <corodist/core/error.hpp>

#include "collective/describe.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <iterator>

namespace corodist::collective {

std::string_view to_string(collective_kind k) noexcept {
  switch (k) {
  case collective_kind::allreduce: return "allreduce";
  case collective_kind::broadcast: return "broadcast";
  case collective_kind::allgather: return "allgather";
  case collective_kind::reduce_scatter: return "reduce_scatter";
  case collective_kind::barrier: return "barrier";
  case collective_kind::allreduce_coalesced: return "allreduce_coalesced";
  case collective_kind::broadcast_coalesced: return "broadcast_coalesced";
  case collective_kind::send: return "send";
  case collective_kind::recv: return "recv";
  case collective_kind::batch_isend_irecv: return "batch_isend_irecv";
  case collective_kind::all_to_all_single: return "all_to_all_single";
  case collective_kind::all_to_all: return "all_to_all";
  case collective_kind::gather: return "gather";
  case collective_kind::scatter: return "scatter";
  case collective_kind::reduce: return "reduce";
  case collective_kind::allgatherv: return "allgatherv";
  case collective_kind::monitored_barrier: return "monitored_barrier";
  }
  return "invalid";
}

namespace detail {

namespace {
using buffer = fmt::memory_buffer;

void tensor_to(buffer& out, const tensor_view& t) {
  fmt::format_to(std::back_inserter(out), "{} x {}", to_string(t.type()), t.count());
  if (t.where() != device::cpu())
    fmt::format_to(std::back_inserter(out), " on {}", t.where().to_string());
}

void text_to(buffer& out, std::string_view text) { out.append(text.data(), text.data() + text.size()); }

void splits_to(buffer& out, const std::vector<std::size_t>& splits) {
  if (splits.empty())
    text_to(out, "even");
  else
    fmt::format_to(std::back_inserter(out), "[{}]", fmt::join(splits, ", "));
}

void buffers_to(buffer& out, const std::vector<tensor_view>& ts, std::size_t from, std::size_t n) {
  fmt::format_to(std::back_inserter(out), "{} buffer{}", n, n == 1 ? "" : "s");
  for (std::size_t i = 0; i < n && i < 4; ++i) {
    text_to(out, i == 0 ? ": " : ", ");
    tensor_to(out, ts[from + i]);
  }
  if (n > 4)
    text_to(out, ", ...");
}

void p2p_to(buffer& out, const p2p_op& o) {
  text_to(out, o.dir == p2p_op::direction::send ? "send(" : "recv(");
  tensor_to(out, o.tensor);
  if (o.dir == p2p_op::direction::send)
    fmt::format_to(std::back_inserter(out), " to rank {}, tag {})", o.peer, o.tag);
  else if (o.peer == any_source)
    fmt::format_to(std::back_inserter(out), " from any rank, tag {})", o.tag);
  else
    fmt::format_to(std::back_inserter(out), " from rank {}, tag {})", o.peer, o.tag);
}
} // namespace

std::string describe(const p2p_op& o) {
  buffer out;
  p2p_to(out, o);
  return fmt::to_string(out);
}

void describe_args_to(fmt::memory_buffer& out, const collective_call& call) {
  switch (call.kind) {
  case collective_kind::allreduce:
    tensor_to(out, call.tensors.at(0));
    text_to(out, ", ");
    text_to(out, to_string(call.op));
    break;
  case collective_kind::broadcast:
    tensor_to(out, call.tensors.at(0));
    fmt::format_to(std::back_inserter(out), ", root {}", call.root);
    break;
  case collective_kind::allgather:
  case collective_kind::reduce_scatter:
    text_to(out, "in ");
    tensor_to(out, call.tensors.at(0));
    text_to(out, ", out ");
    tensor_to(out, call.tensors.at(1));
    if (call.kind == collective_kind::reduce_scatter) {
      text_to(out, ", ");
      text_to(out, to_string(call.op));
    }
    break;
  case collective_kind::barrier:
  case collective_kind::monitored_barrier:
    break;
  case collective_kind::allreduce_coalesced:
  case collective_kind::broadcast_coalesced:
    buffers_to(out, call.tensors, 0, call.tensors.size());
    if (call.kind == collective_kind::allreduce_coalesced) {
      text_to(out, ", ");
      text_to(out, to_string(call.op));
    } else {
      fmt::format_to(std::back_inserter(out), ", root {}", call.root);
    }
    break;
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv:
    for (std::size_t i = 0; i < call.p2p.size() && i < 4; ++i) {
      if (i > 0)
        text_to(out, ", ");
      p2p_to(out, call.p2p[i]);
    }
    if (call.p2p.size() > 4)
      fmt::format_to(std::back_inserter(out), ", ... ({} in all)", call.p2p.size());
    break;
  case collective_kind::all_to_all_single:
    text_to(out, "in ");
    tensor_to(out, call.tensors.at(0));
    text_to(out, ", out ");
    tensor_to(out, call.tensors.at(1));
    text_to(out, ", in_splits ");
    splits_to(out, call.in_splits);
    text_to(out, ", out_splits ");
    splits_to(out, call.out_splits);
    break;
  case collective_kind::all_to_all: {
    const auto n = call.tensors.size() / 2;
    text_to(out, "in ");
    buffers_to(out, call.tensors, 0, n);
    text_to(out, "; out ");
    buffers_to(out, call.tensors, n, n);
    break;
  }
  case collective_kind::gather:
  case collective_kind::scatter:
    text_to(out, "in ");
    tensor_to(out, call.tensors.at(0));
    text_to(out, ", out ");
    tensor_to(out, call.tensors.at(1));
    fmt::format_to(std::back_inserter(out), ", root {}", call.root);
    break;
  case collective_kind::reduce:
    tensor_to(out, call.tensors.at(0));
    fmt::format_to(std::back_inserter(out), ", {}, root {}", to_string(call.op), call.root);
    break;
  case collective_kind::allgatherv:
    text_to(out, "in ");
    tensor_to(out, call.tensors.at(0));
    text_to(out, ", out ");
    tensor_to(out, call.tensors.at(1));
    text_to(out, ", counts ");
    splits_to(out, call.in_splits);
    break;
  }
}

std::string describe(const collective_call& call) {
  // A single send or recv reads as its entry ("send(float32 x 4 to rank 1, tag 0)").
  if ((call.kind == collective_kind::send || call.kind == collective_kind::recv) && !call.p2p.empty())
    return describe(call.p2p[0]);
  buffer out;
  text_to(out, to_string(call.kind));
  text_to(out, "(");
  describe_args_to(out, call);
  text_to(out, ")");
  return fmt::to_string(out);
}

std::string where(const collective_call& call, std::uint64_t seq, int rank, int size, const std::string& group) {
  return fmt::format("{} #{} on rank {} of {} ({})", to_string(call.kind), seq, rank, size, group);
}

collective_error error_at(const call_site& site, const std::string& what) {
  return collective_error(where(site.call, site.seq, site.rank, site.size, site.group) + ": " + what,
                          std::string(to_string(site.call.kind)), site.rank, site.seq);
}

collective_timeout_error timeout_at(const call_site& site, const std::string& what) {
  return collective_timeout_error(where(site.call, site.seq, site.rank, site.size, site.group) + ": " + what,
                                  std::string(to_string(site.call.kind)), site.rank, site.seq);
}

} // namespace detail

process_group::process_group(int rank, int size, corodist::timeout timeout)
    : rank_(rank), size_(size), timeout_(group_timeout(timeout, timeout, "process group")) {
  if (size < 1 || rank < 0 || rank >= size)
    throw usage_error(fmt::format("process group: need 0 <= rank < size (rank {}, size {})", rank, size));
}

corodist::timeout process_group::group_timeout(corodist::timeout t, corodist::timeout fallback,
                                               std::string_view what) {
  t = t.or_else(fallback);
  if (!t.is_finite() || t.length().count() <= 0)
    throw usage_error(std::string(what) + ": the timeout must be a positive length (" + t.str() +
                      " given; a group's collectives need a finite one)");
  return t;
}

process_group::~process_group() = default;

namespace {

[[noreturn]] void bad_call(const collective_call& call, const std::string& why) {
  throw usage_error(std::string(to_string(call.kind)) + ": " + why);
}

void check_tensor(const collective_call& call, const tensor_view& t, const char* what) {
  if (element_size(t.type()) == 0)
    bad_call(call, std::string(what) + " has an invalid dtype");
  if (t.count() > 0 && t.data() == nullptr)
    bad_call(call, fmt::format("{} has {} elements but no data (null pointer)", what, t.count()));
}

void check_same(const collective_call& call, const tensor_view& a, const tensor_view& b) {
  if (a.type() != b.type())
    bad_call(call, fmt::format("input is {} but output is {}", to_string(a.type()), to_string(b.type())));
  if (a.where() != b.where())
    bad_call(call, "input is on " + a.where().to_string() + " but output is on " + b.where().to_string());
}

void check_root(const collective_call& call, int size) {
  if (call.root < 0 || call.root >= size)
    bad_call(call, fmt::format("root {} is not a rank of this group of {}", call.root, size));
}

// An {input, output} pair of one dtype on one device.
void check_pair(const collective_call& call) {
  check_tensor(call, call.tensors[0], "the input");
  check_tensor(call, call.tensors[1], "the output");
  check_same(call, call.tensors[0], call.tensors[1]);
}

// A split list of all_to_all_single: empty (even blocks) or one count per
// rank adding up to the buffer.
void check_splits(const collective_call& call, const std::vector<std::size_t>& splits, const tensor_view& t,
                  const char* buffer, const char* name, int size) {
  if (splits.empty()) {
    if (t.count() % static_cast<std::size_t>(size) != 0)
      bad_call(call, fmt::format("without {} the {} ({} elements) must split evenly over {} ranks", name, buffer,
                                 t.count(), size));
    return;
  }
  if (splits.size() != static_cast<std::size_t>(size))
    bad_call(call, fmt::format("{} has {} entries; it needs one per rank ({})", name, splits.size(), size));
  std::size_t total = 0;
  for (auto c : splits)
    total += c;
  if (total != t.count())
    bad_call(call, fmt::format("{} adds up to {} elements but the {} has {}", name, total, buffer, t.count()));
}

void check_all_to_all(const collective_call& call, int size) {
  const auto n = static_cast<std::size_t>(size);
  if (call.tensors.size() != 2 * n)
    bad_call(call, fmt::format("needs {} inputs and {} outputs (one per rank), not {} and {}", n, n,
                               call.tensors.size() / 2, call.tensors.size() - call.tensors.size() / 2));
  for (std::size_t i = 0; i < 2 * n; ++i) {
    const auto what = fmt::format("{} {}", i < n ? "input" : "output", i % n);
    check_tensor(call, call.tensors[i], what.c_str());
    check_same(call, call.tensors[0], call.tensors[i]);
  }
}

void check_all_to_all_self(const collective_call& call, int rank, int size) {
  const auto me = static_cast<std::size_t>(rank);
  const auto& in = call.tensors[me];
  const auto& out = call.tensors[static_cast<std::size_t>(size) + me];
  if (in.count() != out.count())
    bad_call(call, fmt::format("input {} has {} elements but output {} (this rank's own) has {}", rank, in.count(),
                               rank, out.count()));
}

void check_p2p(const collective_call& call, int rank, int size) {
  if (call.p2p.empty())
    bad_call(call, "no sends or receives given");
  for (std::size_t i = 0; i < call.p2p.size(); ++i) {
    const auto& o = call.p2p[i];
    const auto what = call.p2p.size() == 1 ? std::string("the buffer") : fmt::format("entry {}'s buffer", i);
    check_tensor(call, o.tensor, what.c_str());
    if (o.tensor.where() != call.p2p[0].tensor.where())
      bad_call(call, fmt::format("entry {} is on {} but entry 0 on {}", i, o.tensor.where().to_string(),
                                 call.p2p[0].tensor.where().to_string()));
    const bool any = o.peer == any_source && o.dir == p2p_op::direction::recv;
    if (any && call.kind == collective_kind::batch_isend_irecv)
      bad_call(call, fmt::format("entry {} receives from any rank: only a single recv can", i));
    if (!any && (o.peer < 0 || o.peer >= size))
      bad_call(call, fmt::format("peer {} is not a rank of this group of {}", o.peer, size));
    if (o.peer == rank)
      bad_call(call, fmt::format("peer {} is this rank (a rank cannot send to itself)", o.peer));
  }
}

} // namespace

work process_group::issue(collective_call call, call_options opts) {
  call.timeout = opts.timeout.or_else(timeout_);
  if (call.timeout.is_finite() && call.timeout.length().count() <= 0)
    bad_call(call, "a zero timeout: its deadline passed before it was issued");
  call.by = call.timeout.from();
  call.stream = opts.stream;
  call.where = opts.where;
  switch (call.kind) {
  case collective_kind::allreduce:
  case collective_kind::broadcast:
    check_tensor(call, call.tensors[0], "the buffer");
    break;
  case collective_kind::allgather:
    check_pair(call);
    if (call.tensors[1].count() != call.tensors[0].count() * static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("the output must hold size() x input = {} x {} elements, not {}", size_,
                                 call.tensors[0].count(), call.tensors[1].count()));
    break;
  case collective_kind::reduce_scatter:
    check_pair(call);
    if (call.tensors[0].count() != call.tensors[1].count() * static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("the input must hold size() x output = {} x {} elements, not {}", size_,
                                 call.tensors[1].count(), call.tensors[0].count()));
    break;
  case collective_kind::barrier:
  case collective_kind::monitored_barrier:
    break;
  case collective_kind::send:
  case collective_kind::recv:
  case collective_kind::batch_isend_irecv:
    check_p2p(call, rank_, size_);
    break;
  case collective_kind::all_to_all_single: {
    check_pair(call);
    check_splits(call, call.in_splits, call.tensors[0], "input", "in_splits", size_);
    check_splits(call, call.out_splits, call.tensors[1], "output", "out_splits", size_);
    const auto me = static_cast<std::size_t>(rank_);
    const auto n = static_cast<std::size_t>(size_);
    const auto to_self = call.in_splits.empty() ? call.tensors[0].count() / n : call.in_splits[me];
    const auto from_self = call.out_splits.empty() ? call.tensors[1].count() / n : call.out_splits[me];
    if (to_self != from_self)
      bad_call(call, fmt::format("this rank sends itself {} elements but expects {} from itself", to_self, from_self));
    const auto* a = static_cast<const std::byte*>(call.tensors[0].data());
    const auto* b = static_cast<const std::byte*>(call.tensors[1].data());
    if (call.tensors[0].bytes() > 0 && call.tensors[1].bytes() > 0 && a < b + call.tensors[1].bytes() &&
        b < a + call.tensors[0].bytes())
      bad_call(call, "the input and the output overlap (an all-to-all cannot run in place)");
    break;
  }
  case collective_kind::all_to_all:
    check_all_to_all(call, size_);
    check_all_to_all_self(call, rank_, size_);
    break;
  case collective_kind::gather:
  case collective_kind::scatter: {
    check_root(call, size_);
    check_tensor(call, call.tensors[0], "the input");
    check_tensor(call, call.tensors[1], "the output");
    if (rank_ != call.root)
      break; // the root's other buffer is ignored elsewhere
    check_same(call, call.tensors[0], call.tensors[1]);
    const bool g = call.kind == collective_kind::gather;
    const auto& block = g ? call.tensors[0] : call.tensors[1];
    const auto& whole = g ? call.tensors[1] : call.tensors[0];
    if (whole.count() != block.count() * static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("the root's {} must hold size() x {} = {} x {} elements, not {}",
                                 g ? "output" : "input", g ? "input" : "output", size_, block.count(), whole.count()));
    break;
  }
  case collective_kind::reduce:
    check_root(call, size_);
    check_tensor(call, call.tensors[0], "the buffer");
    break;
  case collective_kind::allgatherv: {
    check_pair(call);
    if (call.in_splits.size() != static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("counts has {} entries; it needs one per rank ({})", call.in_splits.size(), size_));
    std::size_t total = 0;
    for (auto c : call.in_splits)
      total += c;
    if (call.tensors[0].count() != call.in_splits[static_cast<std::size_t>(rank_)])
      bad_call(call, fmt::format("the input has {} elements but counts[{}] is {}", call.tensors[0].count(), rank_,
                                 call.in_splits[static_cast<std::size_t>(rank_)]));
    if (call.tensors[1].count() != total)
      bad_call(call, fmt::format("the output must hold the sum of counts ({} elements), not {}", total,
                                 call.tensors[1].count()));
    break;
  }
  case collective_kind::allreduce_coalesced:
  case collective_kind::broadcast_coalesced:
    for (std::size_t i = 0; i < call.tensors.size(); ++i) {
      const auto what = fmt::format("buffer {}", i);
      check_tensor(call, call.tensors[i], what.c_str());
      if (call.tensors[i].where() != call.tensors[0].where())
        bad_call(call, fmt::format("buffer {} is on {} but buffer 0 on {}", i, call.tensors[i].where().to_string(),
                                   call.tensors[0].where().to_string()));
    }
    break;
  }
  if (call.kind == collective_kind::broadcast || call.kind == collective_kind::broadcast_coalesced)
    check_root(call, size_);

  if (static_cast<std::uint8_t>(call.op) > static_cast<std::uint8_t>(reduce_op::product))
    bad_call(call, "invalid reduce_op");
  return submit(std::move(call));
}

namespace {
collective_call make_call(collective_kind kind, std::vector<tensor_view> tensors, reduce_op op, int root) {
  collective_call c;
  c.kind = kind;
  c.tensors = std::move(tensors);
  c.op = op;
  c.root = root;
  return c;
}

collective_call p2p_call(collective_kind kind, std::vector<p2p_op> ops) {
  collective_call c;
  c.kind = kind;
  c.p2p = std::move(ops);
  return c;
}
} // namespace

work process_group::allreduce(tensor_view t, reduce_op op, call_options opts) {
  return issue(make_call(collective_kind::allreduce, {t}, op, 0), opts);
}

work process_group::allreduce_coalesced(std::vector<tensor_view> ts, reduce_op op, call_options opts) {
  return issue(make_call(collective_kind::allreduce_coalesced, std::move(ts), op, 0), opts);
}

work process_group::broadcast(tensor_view t, int root, call_options opts) {
  return issue(make_call(collective_kind::broadcast, {t}, reduce_op::sum, root), opts);
}

work process_group::broadcast_coalesced(std::vector<tensor_view> ts, int root, call_options opts) {
  return issue(make_call(collective_kind::broadcast_coalesced, std::move(ts), reduce_op::sum, root), opts);
}

work process_group::allgather(tensor_view input, tensor_view output, call_options opts) {
  return issue(make_call(collective_kind::allgather, {input, output}, reduce_op::sum, 0), opts);
}

work process_group::reduce_scatter(tensor_view input, tensor_view output, reduce_op op, call_options opts) {
  return issue(make_call(collective_kind::reduce_scatter, {input, output}, op, 0), opts);
}

work process_group::barrier(call_options opts) {
  return issue(make_call(collective_kind::barrier, {}, reduce_op::sum, 0), opts);
}


work process_group::send(tensor_view t, int dst, std::uint32_t tag, call_options opts) {
  return issue(p2p_call(collective_kind::send, {p2p_op::isend(t, dst, tag)}), opts);
}

work process_group::recv(tensor_view t, int src, std::uint32_t tag, call_options opts) {
  return issue(p2p_call(collective_kind::recv, {p2p_op::irecv(t, src, tag)}), opts);
}

work process_group::batch_isend_irecv(std::vector<p2p_op> ops, call_options opts) {
  return issue(p2p_call(collective_kind::batch_isend_irecv, std::move(ops)), opts);
}

work process_group::all_to_all_single(tensor_view input, tensor_view output, std::vector<std::size_t> in_splits,
                                      std::vector<std::size_t> out_splits, call_options opts) {
  auto c = make_call(collective_kind::all_to_all_single, {input, output}, reduce_op::sum, 0);
  c.in_splits = std::move(in_splits);
  c.out_splits = std::move(out_splits);
  return issue(std::move(c), opts);
}

work process_group::all_to_all(std::vector<tensor_view> inputs, std::vector<tensor_view> outputs,
                               call_options opts) {
  auto c = make_call(collective_kind::all_to_all, std::move(inputs), reduce_op::sum, 0);
  c.tensors.insert(c.tensors.end(), outputs.begin(), outputs.end());
  if (outputs.size() != c.tensors.size() - outputs.size())
    bad_call(c, fmt::format("{} inputs but {} outputs (one each per rank)", c.tensors.size() - outputs.size(),
                            outputs.size()));
  return issue(std::move(c), opts);
}

work process_group::gather(tensor_view input, tensor_view output, int root, call_options opts) {
  return issue(make_call(collective_kind::gather, {input, output}, reduce_op::sum, root), opts);
}

work process_group::scatter(tensor_view input, tensor_view output, int root, call_options opts) {
  return issue(make_call(collective_kind::scatter, {input, output}, reduce_op::sum, root), opts);
}

work process_group::reduce(tensor_view t, int root, reduce_op op, call_options opts) {
  return issue(make_call(collective_kind::reduce, {t}, op, root), opts);
}

work process_group::allgatherv(tensor_view input, tensor_view output, std::vector<std::size_t> counts,
                               call_options opts) {
  auto c = make_call(collective_kind::allgatherv, {input, output}, reduce_op::sum, 0);
  c.in_splits = std::move(counts);
  return issue(std::move(c), opts);
}

work process_group::monitored_barrier(call_options opts) {
  return issue(make_call(collective_kind::monitored_barrier, {}, reduce_op::sum, 0), opts);
}

asio::awaitable<std::shared_ptr<process_group>> process_group::split(int, int, split_options) {
  throw usage_error(fmt::format("split: the {} backend cannot make subgroups", backend()));
  co_return nullptr;
}

asio::awaitable<std::vector<std::pair<int, int>>> process_group::exchange_colors(int color, int key,
                                                                                 corodist::timeout limit) {
  std::vector<std::int64_t> mine{color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size_));
  call_options o;
  o.timeout = limit;
  co_await allgather(tensor_view(mine), tensor_view(all), o);
  std::vector<std::pair<int, int>> out;
  for (std::size_t i = 0; i < all.size(); i += 2)
    out.emplace_back(static_cast<int>(all[i]), static_cast<int>(all[i + 1]));
  co_return out;
}

} // namespace corodist::collective
