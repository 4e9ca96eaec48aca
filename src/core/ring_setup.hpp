#pragma once
/// \file
/// Setup flags for the io_uring ring inside an asio::io_context (io_uring build only).
///
/// Asio 1.22 creates its ring with `io_uring_queue_init(entries, ring, 0)`; asio_impl.cpp
/// routes that one call through init_asio_ring(). A ring gets extra flags only while a
/// ring_flags_scope is alive on the constructing thread, so io_contexts that users make
/// themselves keep Asio's own setup.

struct io_uring;

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

/// The setup flags of the last ring created on this thread through init_asio_ring (tests).
unsigned last_ring_flags() noexcept;

} // namespace corodist::detail
