#include <corodist/collective/process_group.hpp>
#include <corodist/core/error.hpp>

#include "collective/describe.hpp"

#include <fmt/format.h>

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
  }
  return "invalid";
}

namespace detail {

namespace {
std::string tensor_text(const tensor_view& t) {
  auto s = fmt::format("{} x {}", to_string(t.type()), t.count());
  if (t.where() != device::cpu())
    s += " on " + t.where().to_string();
  return s;
}
} // namespace

std::string describe(const collective_call& call) {
  std::string args;
  switch (call.kind) {
  case collective_kind::allreduce:
    args = tensor_text(call.tensors.at(0)) + ", " + std::string(to_string(call.op));
    break;
  case collective_kind::broadcast:
    args = tensor_text(call.tensors.at(0)) + fmt::format(", root {}", call.root);
    break;
  case collective_kind::allgather:
  case collective_kind::reduce_scatter:
    args = "in " + tensor_text(call.tensors.at(0)) + ", out " + tensor_text(call.tensors.at(1));
    if (call.kind == collective_kind::reduce_scatter)
      args += ", " + std::string(to_string(call.op));
    break;
  case collective_kind::barrier:
    break;
  case collective_kind::allreduce_coalesced:
  case collective_kind::broadcast_coalesced: {
    args = fmt::format("{} buffer{}", call.tensors.size(), call.tensors.size() == 1 ? "" : "s");
    for (std::size_t i = 0; i < call.tensors.size() && i < 4; ++i)
      args += (i == 0 ? ": " : ", ") + tensor_text(call.tensors[i]);
    if (call.tensors.size() > 4)
      args += ", ...";
    if (call.kind == collective_kind::allreduce_coalesced)
      args += ", " + std::string(to_string(call.op));
    else
      args += fmt::format(", root {}", call.root);
    break;
  }
  }
  return fmt::format("{}({})", to_string(call.kind), args);
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

} // namespace

work process_group::issue(collective_call call, call_options opts) {
  call.timeout = opts.timeout.or_else(timeout_);
  if (call.timeout.is_finite() && call.timeout.length().count() <= 0)
    bad_call(call, "a zero timeout: its deadline passed before it was issued");
  call.by = call.timeout.from();
  call.stream = opts.stream;
  switch (call.kind) {
  case collective_kind::allreduce:
  case collective_kind::broadcast:
    check_tensor(call, call.tensors[0], "the buffer");
    break;
  case collective_kind::allgather:
    check_tensor(call, call.tensors[0], "the input");
    check_tensor(call, call.tensors[1], "the output");
    check_same(call, call.tensors[0], call.tensors[1]);
    if (call.tensors[1].count() != call.tensors[0].count() * static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("the output must hold size() x input = {} x {} elements, not {}", size_,
                                 call.tensors[0].count(), call.tensors[1].count()));
    break;
  case collective_kind::reduce_scatter:
    check_tensor(call, call.tensors[0], "the input");
    check_tensor(call, call.tensors[1], "the output");
    check_same(call, call.tensors[0], call.tensors[1]);
    if (call.tensors[0].count() != call.tensors[1].count() * static_cast<std::size_t>(size_))
      bad_call(call, fmt::format("the input must hold size() x output = {} x {} elements, not {}", size_,
                                 call.tensors[1].count(), call.tensors[0].count()));
    break;
  case collective_kind::barrier:
    break;
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

work process_group::allreduce(tensor_view t, reduce_op op, call_options opts) {
  return issue({collective_kind::allreduce, {t}, op, 0, {}}, opts);
}

work process_group::allreduce_coalesced(std::vector<tensor_view> ts, reduce_op op, call_options opts) {
  return issue({collective_kind::allreduce_coalesced, std::move(ts), op, 0, {}}, opts);
}

work process_group::broadcast(tensor_view t, int root, call_options opts) {
  return issue({collective_kind::broadcast, {t}, reduce_op::sum, root, {}}, opts);
}

work process_group::broadcast_coalesced(std::vector<tensor_view> ts, int root, call_options opts) {
  return issue({collective_kind::broadcast_coalesced, std::move(ts), reduce_op::sum, root, {}}, opts);
}

work process_group::allgather(tensor_view input, tensor_view output, call_options opts) {
  return issue({collective_kind::allgather, {input, output}, reduce_op::sum, 0, {}}, opts);
}

work process_group::reduce_scatter(tensor_view input, tensor_view output, reduce_op op, call_options opts) {
  return issue({collective_kind::reduce_scatter, {input, output}, op, 0, {}}, opts);
}

work process_group::barrier(call_options opts) {
  return issue({collective_kind::barrier, {}, reduce_op::sum, 0, {}}, opts);
}

} // namespace corodist::collective
