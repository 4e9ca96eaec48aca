#pragma once
/// \file
/// Setup flags for the io_uring ring inside an asio::io_context (io_uring build only).
///
/// Asio 1.22 creates its ring with `io_uring_queue_init(entries, ring, 0)`; asio_impl.cpp
/// routes that one call through init_asio_ring(). A ring gets extra flags only while a
/// ring_flags_scope is alive on the constructing thread, so io_contexts that users make
/// themselves keep Asio's own setup.

struct io_uring;
struct io_uring_sqe;
struct io_uring_cqe;

namespace corodist::detail {

/// The flags event_loop asks for on the rings it owns: IORING_SETUP_COOP_TASKRUN |
/// IORING_SETUP_TASKRUN_FLAG. A completion then no longer interrupts the loop thread with an
/// inter-processor interrupt; the loop runs it on its next entry into the kernel, which
/// the TASKRUN flag makes liburing's peek do as soon as any is pending. Safe when one thread
/// submits and reaps, as an owned event_loop does.
unsigned owned_loop_ring_flags() noexcept;

/// While alive, io_contexts constructed on this thread get `flags` added to their ring.
class ring_flags_scope {
public:
  explicit ring_flags_scope(unsigned flags) noexcept;
  ~ring_flags_scope();
  ring_flags_scope(const ring_flags_scope&) = delete;
  ring_flags_scope& operator=(const ring_flags_scope&) = delete;

private:
  unsigned previous_;
};

/// Creates `ring` like io_uring_queue_init, adding the current ring_flags_scope's flags;
/// falls back to `flags` alone when the kernel refuses them (before Linux 5.19).
/// Returns 0 or a negative errno.
int init_asio_ring(unsigned entries, io_uring* ring, unsigned flags) noexcept;

/// Asio 1.22's cancel: prepares `sqe` to cancel the operation whose user_data is `target`,
/// with a user_data of its own that no operation owns (null, which Asio's reaper skips).
/// Asio never sets the cancel's user_data, and liburing 2.3's io_uring_prep_cancel no
/// longer clears it (liburing issue 848): the SQE slot's previous user_data stayed, so the
/// cancel's completion was delivered to whatever operation last used that slot. The flags
/// Asio passes are dropped: at shutdown it passes IOSQE_IO_DRAIN, which as cancel flags
/// means "match by file descriptor" (and matched nothing), and as an SQE flag would make
/// the cancel of its timeout wait for that very timeout.
void prep_unowned_cancel(io_uring_sqe* sqe, void* target, int asio_flags) noexcept;

/// Asio 1.22's timeout removal: prepares `sqe` to remove the timeout whose user_data is
/// `target`, and gives the removal that same user_data, as later Asio does. Asio 1.22 leaves
/// it unset (the slot's stale value) in io_uring_service::run(usec) (io_context::run_for
/// and friends): the removal's completion went to an unrelated operation, which saw a
/// result of 0 (a read: end of file). With the target's user_data, run() counts it as the
/// second of its two local completions.
void prep_timeout_remove_owned(io_uring_sqe* sqe, unsigned long long target, unsigned flags) noexcept;

/// Asio 1.22's blocking wait for a completion, retried when a signal interrupts it.
/// io_context::run_for (and run_one_for, run_until...) arms a timeout whose user_data is
/// a local of io_uring_service::run(usec); when a signal (a profiler's, libFuzzer's
/// SIGALRM, a user's timer) interrupted the wait, run() returned with that timeout still
/// armed, and its completion came later to another call, whose frame was elsewhere: the
/// stale address was taken for an operation and run (a jump to garbage). Retrying keeps
/// the wait, and so the timeout's completion, inside the call that armed it.
/// Returns 0 or a negative errno other than -EINTR.
int wait_cqe_through_signals(io_uring* ring, io_uring_cqe** cqe) noexcept;

/// The setup flags of the last ring created on this thread through init_asio_ring (tests).
unsigned last_ring_flags() noexcept;

} // namespace corodist::detail
