#include "net/uring_service.hpp"

#if CORODIST_IO_URING

#include <asio/error.hpp>
#include <asio/post.hpp>

#include <liburing.h>

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>

namespace corodist::net::detail {

asio::io_context::id uring_service::id;

namespace {

constexpr unsigned common_flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
// Tried in order; an unknown flag makes the kernel answer EINVAL, and the next is tried.
constexpr unsigned flag_attempts[] = {
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG | common_flags,
    IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG | common_flags,
    IORING_SETUP_CQSIZE,
    0,
};

// Sets up `r` with `preferred` flags first (the first ring's, for the next
// rings), then the list above. Returns 0 or -errno; `used` gets the flags.
int setup_ring(io_uring& r, unsigned preferred, unsigned& used) {
  int rc = -EINVAL;
  auto attempt = [&](unsigned flags) {
    io_uring_params p{};
    p.flags = flags;
    p.cq_entries = uring_service::cq_entries;
    rc = io_uring_queue_init_params(uring_service::sq_entries, &r, &p);
    if (rc == 0)
      used = flags;
    return rc;
  };
  if (preferred != 0 && attempt(preferred) != -EINVAL)
    return rc;
  for (unsigned flags : flag_attempts)
    if (attempt(flags) != -EINVAL)
      return rc;
  return rc;
}

std::uint32_t table_size() noexcept {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return 1024;
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > uring_service::max_slots_per_ring)
    return uring_service::max_slots_per_ring;
  return static_cast<std::uint32_t>(lim.rlim_cur);
}

std::error_code sys_error(int negative_errno) noexcept {
  return {-negative_errno, asio::error::get_system_category()};
}

// A CQE's result as (error, bytes). ECANCELED is asio::error::operation_aborted.
std::pair<std::error_code, std::size_t> outcome(const uring_service::op_base& op, int res) noexcept {
  if (res < 0)
    return {sys_error(res), 0};
  const auto n = static_cast<std::size_t>(res);
  if (n < op.want_all_) { // MSG_WAITALL stopped part way: the kernel gives the count, not the reason
    if (op.cancel_requested_)
      return {asio::error::operation_aborted, n};
    return {op.want_eof_ ? std::error_code(asio::error::eof) : std::error_code(asio::error::broken_pipe), n};
  }
  if (op.want_eof_ && n == 0) // a receive that met the end of the stream
    return {asio::error::eof, 0};
  return {{}, n};
}

} // namespace

struct uring_service::ring {
  io_uring uring{};
  bool live = false;                    // set up (io_uring_queue_exit due)
  std::uint32_t index = 0;              // in the service's rings_
  std::uint32_t slots = 0;
  std::uint32_t next_fresh = 0;         // slots [next_fresh, slots) never used
  std::vector<std::uint32_t> released;  // slots used once and freed since
  std::size_t in_flight = 0;

  ring() = default;
  ring(const ring&) = delete;
  ring& operator=(const ring&) = delete;
  ~ring() {
    if (live)
      io_uring_queue_exit(&uring);
  }

  [[nodiscard]] bool has_room() const noexcept { return next_fresh < slots || !released.empty(); }
  std::uint32_t take_slot() {
    if (!released.empty()) {
      std::uint32_t s = released.back();
      released.pop_back();
      return s;
    }
    return next_fresh++;
  }
  [[nodiscard]] unsigned sq_flags() const noexcept { return IO_URING_READ_ONCE(*uring.sq.kflags); }
  // Deferred task work to run, or completions the kernel could not post yet.
  [[nodiscard]] bool kernel_has_work() const noexcept {
    return (sq_flags() & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0;
  }
};

uring_service::uring_service(asio::io_context& ctx)
    : asio::execution_context::service(ctx), ctx_(ctx), efd_(ctx) {}

uring_service::~uring_service() {
  if (!shut_down_)
    shutdown();
}

std::string uring_service::describe_flags(unsigned flags) {
  static constexpr std::pair<unsigned, const char*> names[] = {
      {IORING_SETUP_SINGLE_ISSUER, "SINGLE_ISSUER"}, {IORING_SETUP_DEFER_TASKRUN, "DEFER_TASKRUN"},
      {IORING_SETUP_COOP_TASKRUN, "COOP_TASKRUN"},   {IORING_SETUP_TASKRUN_FLAG, "TASKRUN_FLAG"},
      {IORING_SETUP_SUBMIT_ALL, "SUBMIT_ALL"},       {IORING_SETUP_CQSIZE, "CQSIZE"},
  };
  std::string out;
  for (auto [bit, name] : names)
    if (flags & bit) {
      if (!out.empty())
        out += '|';
      out += name;
    }
  return out.empty() ? std::string("none") : out;
}

bool uring_service::available(std::string* why) {
  auto fail = [&](const char* what, int negative_errno) {
    if (why)
      *why = std::string(what) + ": " + std::strerror(-negative_errno);
    return false;
  };
  io_uring r{};
  unsigned flags = 0;
  if (int rc = setup_ring(r, 0, flags); rc < 0)
    return fail("io_uring_queue_init", rc);
  struct exit_guard {
    io_uring* r;
    ~exit_guard() { io_uring_queue_exit(r); }
  } guard{&r};
  io_uring_probe* probe = io_uring_get_probe_ring(&r);
  if (probe == nullptr)
    return fail("io_uring_get_probe_ring", -ENOSYS);
  bool ops = true;
  for (int op : {IORING_OP_RECV, IORING_OP_SEND, IORING_OP_SENDMSG, IORING_OP_ASYNC_CANCEL})
    ops = ops && io_uring_opcode_supported(probe, op);
  io_uring_free_probe(probe);
  if (!ops)
    return fail("io_uring lacks recv/send/sendmsg/async_cancel", -ENOSYS);
  if (int rc = io_uring_register_files_sparse(&r, 1); rc < 0)
    return fail("io_uring_register_files_sparse", rc);
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0)
    return fail("eventfd", -errno);
  int rc = io_uring_register_eventfd(&r, efd);
  ::close(efd);
  if (rc < 0)
    return fail("io_uring_register_eventfd", rc);
  // Cancelling by fixed descriptor (5.19): an empty slot answers EBADF or ENOENT, an old kernel EINVAL.
  io_uring_sqe* sqe = io_uring_get_sqe(&r);
  io_uring_prep_cancel_fd(sqe, 0, IORING_ASYNC_CANCEL_FD_FIXED | IORING_ASYNC_CANCEL_ALL);
  io_uring_cqe* cqe = nullptr;
  if (rc = io_uring_submit_and_wait(&r, 1); rc < 0)
    return fail("io_uring_submit", rc);
  if (rc = io_uring_peek_cqe(&r, &cqe); rc < 0)
    return fail("io_uring_peek_cqe", rc);
  const int res = cqe->res;
  io_uring_cqe_seen(&r, cqe);
  if (res == -EINVAL)
    return fail("IORING_ASYNC_CANCEL_FD_FIXED", res);
  if (why)
    *why = "io_uring with " + describe_flags(flags);
  return true;
}

// ---- rings and adoption ----

bool uring_service::make_eventfd(std::error_code& ec) {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) {
    ec = sys_error(-errno);
    return false;
  }
  efd_.assign(efd, ec);
  if (ec) {
    ::close(efd);
    return false;
  }
  return true;
}

uring_service::ring* uring_service::ring_with_room(std::error_code& ec) {
  for (auto& r : rings_)
    if (r->has_room())
      return r.get();
  if (rings_.size() >= max_rings) {
    ec = std::make_error_code(std::errc::too_many_files_open);
    return nullptr;
  }
  if (!efd_.is_open() && !make_eventfd(ec))
    return nullptr;
  auto r = std::make_unique<ring>();
  unsigned flags = 0;
  if (int rc = setup_ring(r->uring, setup_flags_, flags); rc < 0) {
    ec = sys_error(rc);
    return nullptr;
  }
  r->live = true;
  const std::uint32_t n = table_size();
  if (int rc = io_uring_register_files_sparse(&r->uring, n); rc < 0) {
    ec = sys_error(rc);
    return nullptr;
  }
  if (int rc = io_uring_register_eventfd(&r->uring, efd_.native_handle()); rc < 0) {
    ec = sys_error(rc);
    return nullptr;
  }
  r->slots = n;
  r->index = static_cast<std::uint32_t>(rings_.size());
  setup_flags_ = flags;
  issuer_ = std::this_thread::get_id();
  rings_.push_back(std::move(r));
  return rings_.back().get();
}

uring_service::ring* uring_service::ring_of(uring_file f) noexcept {
  if (f.ring >= rings_.size() || f.slot >= rings_[f.ring]->slots)
    return nullptr;
  return rings_[f.ring].get();
}

uring_file uring_service::adopt(int fd, std::error_code& ec) {
  ec.clear();
  if (shut_down_) {
    ec = asio::error::shut_down;
    return {};
  }
  if (fd < 0) {
    ec = asio::error::bad_descriptor;
    return {};
  }
  ring* r = ring_with_room(ec);
  if (r == nullptr)
    return {};
  const std::uint32_t slot = r->take_slot();
  const int rc = io_uring_register_files_update(&r->uring, slot, &fd, 1);
  if (rc != 1) {
    r->released.push_back(slot);
    ec = rc < 0 ? sys_error(rc) : asio::error::bad_descriptor;
    return {};
  }
  ::close(fd); // the table holds the socket now
  ++adopted_;
  return {r->index, slot};
}

// ---- operations ----

io_uring_sqe* uring_service::get_sqe(ring& r, std::error_code& ec) {
  io_uring_sqe* sqe = io_uring_get_sqe(&r.uring);
  if (sqe == nullptr) { // the queue is full: this batch goes now
    int rc = 0;
    do
      rc = io_uring_submit(&r.uring);
    while (rc == -EINTR);
    sqe = io_uring_get_sqe(&r.uring);
    if (sqe == nullptr)
      ec = rc < 0 ? sys_error(rc) : std::error_code(asio::error::no_buffer_space);
  }
  return sqe;
}

void uring_service::track(op_base* op, ring& r) {
  op->ring_ = r.index;
  op->prev_ = nullptr;
  op->next_ = ops_;
  if (ops_ != nullptr)
    ops_->prev_ = op;
  ops_ = op;
  ++r.in_flight;
  ++in_flight_;
  request_submit();
  arm_wait();
}

void uring_service::untrack(op_base* op) noexcept {
  if (op->prev_ != nullptr)
    op->prev_->next_ = op->next_;
  else
    ops_ = op->next_;
  if (op->next_ != nullptr)
    op->next_->prev_ = op->prev_;
  op->prev_ = op->next_ = nullptr;
  op->ring_ = uring_file::invalid;
}

void uring_service::start_recv(uring_file f, asio::mutable_buffer buf, bool all, op_base* op) {
  if (shut_down_) {
    op->fn_(op, nullptr, {}, 0);
    return;
  }
  ring* r = ring_of(f);
  if (r == nullptr)
    return complete_soon(op, asio::error::bad_descriptor, 0);
  if (buf.size() == 0)
    return complete_soon(op, {}, 0);
  std::error_code ec;
  io_uring_sqe* sqe = get_sqe(*r, ec);
  if (sqe == nullptr)
    return complete_soon(op, ec, 0);
  const auto len = static_cast<unsigned>(std::min<std::size_t>(buf.size(), std::size_t{1} << 30));
  io_uring_prep_recv(sqe, static_cast<int>(f.slot), buf.data(), len, all ? MSG_WAITALL : 0);
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, op);
  op->want_eof_ = true;
  op->want_all_ = all ? len : 0;
  track(op, *r);
}

void uring_service::start_send(uring_file f, std::span<const asio::const_buffer> bufs, bool all,
                               send_op_base* op) {
  if (shut_down_) {
    op->fn_(op, nullptr, {}, 0);
    return;
  }
  ring* r = ring_of(f);
  if (r == nullptr)
    return complete_soon(op, asio::error::bad_descriptor, 0);
  const std::size_t count = std::min<std::size_t>(bufs.size(), IOV_MAX);
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i)
    total += bufs[i].size();
  if (total == 0)
    return complete_soon(op, {}, 0);
  std::error_code ec;
  io_uring_sqe* sqe = get_sqe(*r, ec);
  if (sqe == nullptr)
    return complete_soon(op, ec, 0);
  const int flags = MSG_NOSIGNAL | (all ? MSG_WAITALL : 0);
  if (count == 1) {
    io_uring_prep_send(sqe, static_cast<int>(f.slot), bufs[0].data(), bufs[0].size(), flags);
  } else {
    iovec* iov = op->inline_iov_;
    if (count > inline_iovecs) {
      op->heap_iov_ = std::make_unique<iovec[]>(count);
      iov = op->heap_iov_.get();
    }
    for (std::size_t i = 0; i < count; ++i)
      iov[i] = {const_cast<void*>(bufs[i].data()), bufs[i].size()};
    op->msg_.msg_iov = iov;
    op->msg_.msg_iovlen = count;
    io_uring_prep_sendmsg(sqe, static_cast<int>(f.slot), &op->msg_, static_cast<unsigned>(flags));
  }
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, op);
  op->want_all_ = all && total <= UINT32_MAX ? static_cast<std::uint32_t>(total) : 0;
  track(op, *r);
}

void uring_service::cancel_op(op_base* op) {
  if (shut_down_ || op->cancel_requested_ || op->ring_ == uring_file::invalid)
    return;
  op->cancel_requested_ = true;
  ring& r = *rings_[op->ring_];
  std::error_code ignored;
  io_uring_sqe* sqe = get_sqe(r, ignored);
  if (sqe == nullptr)
    return;
  // By user_data: an operation queued before this cancel is issued before it
  // (one ring, in order), and one made later at the same address after it.
  io_uring_prep_cancel64(sqe, reinterpret_cast<std::uintptr_t>(op), 0);
  queue_internal(r, sqe);
}

// An SQE of the service's own (a cancel): no operation completes with it.
void uring_service::queue_internal(ring& r, io_uring_sqe* sqe) {
  io_uring_sqe_set_data(sqe, nullptr);
  ++r.in_flight;
  ++in_flight_;
  request_submit();
  arm_wait();
}

void uring_service::cancel(uring_file f) {
  if (shut_down_)
    return;
  ring* r = ring_of(f);
  if (r == nullptr)
    return;
  std::error_code ignored;
  io_uring_sqe* sqe = get_sqe(*r, ignored);
  if (sqe == nullptr)
    return;
  io_uring_prep_cancel_fd(sqe, static_cast<int>(f.slot), IORING_ASYNC_CANCEL_FD_FIXED | IORING_ASYNC_CANCEL_ALL);
  queue_internal(*r, sqe);
}

void uring_service::close(uring_file f) {
  if (shut_down_)
    return;
  ring* r = ring_of(f);
  if (r == nullptr)
    return;
  cancel(f);
  // The cancel looks the socket up in the table when it is issued: issue it
  // (and whatever was queued before it) before the slot is emptied.
  int rc = 0;
  do
    rc = io_uring_submit(&r->uring);
  while (rc == -EINTR);
  const int none = -1;
  io_uring_register_files_update(&r->uring, f.slot, &none, 1);
  r->released.push_back(f.slot);
  --adopted_;
}

// ---- completions ----

void uring_service::complete_soon(op_base* op, std::error_code ec, std::size_t n) {
  immediate_.push_back({op, ec, n});
  if (!immediate_posted_) {
    immediate_posted_ = true;
    asio::post(ctx_, [this] { run_immediate(); });
  }
}

void uring_service::run_immediate() {
  immediate_posted_ = false;
  std::vector<immediate> batch;
  batch.swap(immediate_);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    try {
      batch[i].op->fn_(batch[i].op, this, batch[i].ec, batch[i].n);
    } catch (...) { // the rest still complete, later
      for (std::size_t j = i + 1; j < batch.size(); ++j)
        complete_soon(batch[j].op, batch[j].ec, batch[j].n);
      throw;
    }
  }
}

void uring_service::request_submit() {
  if (in_pass_ || submit_posted_)
    return;
  submit_posted_ = true;
  asio::post(ctx_, [this] {
    submit_posted_ = false;
    submit_all();
  });
}

// A SINGLE_ISSUER ring refuses every submission (and its deferred task work
// runs) from another thread than the one that made it, as when an event loop
// drains its context on the thread destroying it: what is queued there stays
// until the ring's own thread comes back, or the ring goes at shutdown,
// without a pass posted again and again meanwhile.
bool uring_service::foreign_thread() const noexcept {
  return (setup_flags_ & IORING_SETUP_SINGLE_ISSUER) != 0 && std::this_thread::get_id() != issuer_;
}

void uring_service::submit_all() {
  if (foreign_thread())
    return;
  bool more = false;
  for (auto& r : rings_) {
    if (io_uring_sq_ready(&r->uring) > 0) {
      int rc = 0;
      do
        rc = io_uring_submit(&r->uring);
      while (rc == -EINTR);
      if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
        throw std::system_error(sys_error(rc), "io_uring_submit (uring_service)");
      if (rc < 0) // short of resources: left queued, tried again on the next pass
        more = true;
    }
    // Completed while submitting (a send that went out at once): reaped now,
    // without waiting for the eventfd to come round.
    if (io_uring_cq_ready(&r->uring) > 0 || r->kernel_has_work())
      more = true;
  }
  if (more)
    post_pass();
}

void uring_service::post_pass() {
  if (pass_posted_)
    return;
  pass_posted_ = true;
  asio::post(ctx_, [this] {
    pass_posted_ = false;
    run_pass();
  });
}

void uring_service::arm_wait() {
  if (wait_armed_ || in_flight_ == 0 || shut_down_ || !efd_.is_open())
    return;
  wait_armed_ = true;
  efd_.async_wait(asio::posix::descriptor_base::wait_read, [this](std::error_code ec) {
    wait_armed_ = false;
    if (ec == asio::error::operation_aborted || shut_down_)
      return;
    on_wake();
  });
}

void uring_service::on_wake() {
  ++eventfd_wakes_;
  std::uint64_t count = 0;
  // Consumed before the rings are looked at: a signal after this read is
  // seen again by the next wait.
  [[maybe_unused]] auto n = ::read(efd_.native_handle(), &count, sizeof count);
  run_pass();
}

void uring_service::run_pass() {
  if (foreign_thread())
    return;
  if (in_pass_) {
    post_pass();
    return;
  }
  in_pass_ = true;
  struct pass_end {
    bool& flag;
    ~pass_end() { flag = false; }
  } end{in_pass_};
  // Handlers that start operations get them submitted (and what completes at
  // once reaped) in the next round; a few rounds, then the loop's other work.
  for (int round = 0; round < 8; ++round) {
    bool any = false;
    for (std::size_t i = 0; i < rings_.size(); ++i) { // handlers may add rings
      ring& r = *rings_[i];
      if (io_uring_sq_ready(&r.uring) > 0 || r.kernel_has_work()) {
        int rc = 0;
        do
          rc = io_uring_submit_and_get_events(&r.uring);
        while (rc == -EINTR);
        if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
          throw std::system_error(sys_error(rc), "io_uring_submit_and_get_events (uring_service)");
      }
      if (reap(r))
        any = true;
    }
    if (!any)
      break;
  }
  in_pass_ = false;
  submit_all();
  arm_wait();
}

bool uring_service::reap(ring& r) {
  bool reaped = false;
  for (;;) {
    constexpr unsigned batch_max = 64;
    io_uring_cqe* cqes[batch_max];
    const unsigned n = io_uring_peek_batch_cqe(&r.uring, cqes, batch_max);
    if (n == 0)
      return reaped;
    reaped = true;
    struct done {
      op_base* op;
      int res;
    } batch[batch_max];
    unsigned ops = 0;
    for (unsigned i = 0; i < n; ++i) {
      auto* op = static_cast<op_base*>(io_uring_cqe_get_data(cqes[i]));
      if (op != nullptr) // nullptr: a cancel of ours
        batch[ops++] = {op, cqes[i]->res};
    }
    io_uring_cq_advance(&r.uring, n);
    r.in_flight -= n;
    in_flight_ -= n;
    // Out of the list first: a handler that cancels another of this batch
    // finds it already done.
    for (unsigned i = 0; i < ops; ++i)
      untrack(batch[i].op);
    for (unsigned i = 0; i < ops; ++i) {
      op_base* op = batch[i].op;
      const int res = batch[i].res;
      auto [ec, bytes] = outcome(*op, res);
      try {
        op->fn_(op, this, ec, bytes);
      } catch (...) { // the rest of the batch completes from a post
        for (unsigned j = i + 1; j < ops; ++j) {
          auto [ej, nj] = outcome(*batch[j].op, batch[j].res);
          complete_soon(batch[j].op, ej, nj);
        }
        throw;
      }
    }
  }
}

// ---- shutdown ----

void uring_service::shutdown() {
  shut_down_ = true;
  // Closing a ring cancels what it has in flight: the kernel lets go of the
  // buffers before the operations (and their handlers) are destroyed.
  rings_.clear();
  while (ops_ != nullptr) {
    op_base* op = ops_;
    untrack(op);
    op->fn_(op, nullptr, {}, 0); // destroyed, never invoked (as Asio does at shutdown)
  }
  std::vector<immediate> rest;
  rest.swap(immediate_);
  for (auto& i : rest)
    i.op->fn_(i.op, nullptr, {}, 0);
  in_flight_ = 0;
  std::error_code ignored;
  efd_.close(ignored);
}

} // namespace corodist::net::detail

#endif // CORODIST_IO_URING
