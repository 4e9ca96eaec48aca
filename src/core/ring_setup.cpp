#include "core/ring_setup.hpp"

#include <liburing.h>

#include <cerrno>

namespace corodist::detail {
namespace {
thread_local unsigned requested_flags = 0;
thread_local unsigned applied_flags = 0;
} // namespace

unsigned owned_loop_ring_flags() noexcept { return IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG; }

ring_flags_scope::ring_flags_scope(unsigned flags) noexcept : previous_(requested_flags) {
  requested_flags = flags;
}

ring_flags_scope::~ring_flags_scope() { requested_flags = previous_; }

int init_asio_ring(unsigned entries, io_uring* ring, unsigned flags) noexcept {
  int rc = -EINVAL;
  if (requested_flags != 0) {
    io_uring_params p{};
    p.flags = flags | requested_flags;
    rc = io_uring_queue_init_params(entries, ring, &p);
    if (rc == 0) {
      applied_flags = p.flags;
      return 0;
    }
    if (rc != -EINVAL) // only an unknown flag falls back; anything else is the real error
      return rc;
  }
  io_uring_params plain{};
  plain.flags = flags;
  rc = io_uring_queue_init_params(entries, ring, &plain);
  if (rc == 0)
    applied_flags = plain.flags;
  return rc;
}

void prep_unowned_cancel(io_uring_sqe* sqe, void* target, int /*asio_flags*/) noexcept {
  io_uring_prep_cancel(sqe, target, 0);
  io_uring_sqe_set_data(sqe, nullptr);
}

void prep_timeout_remove_owned(io_uring_sqe* sqe, unsigned long long target, unsigned flags) noexcept {
  io_uring_prep_timeout_remove(sqe, target, flags);
  sqe->user_data = target;
}

int wait_cqe_through_signals(io_uring* ring, io_uring_cqe** cqe) noexcept {
  int rc = 0;
  do
    rc = io_uring_wait_cqe(ring, cqe);
  while (rc == -EINTR);
  return rc;
}

unsigned last_ring_flags() noexcept { return applied_flags; }

} // namespace corodist::detail
