// The one translation unit that compiles Asio (ASIO_SEPARATE_COMPILATION).
#if CORODIST_IO_URING
#include "core/ring_setup.hpp"
#include <liburing.h>
// Asio 1.22 creates its ring with `io_uring_queue_init(entries, ring, 0)` in
// io_uring_service::init_ring(), its only call of that function: route it through
// init_asio_ring so rings made by event_loop get its setup flags (core/ring_setup.hpp).
#define io_uring_queue_init corodist::detail::init_asio_ring
// Its cancels get a user_data that no operation owns (core/ring_setup.hpp).
#define io_uring_prep_cancel corodist::detail::prep_unowned_cancel
// Its timeout removals get their target's user_data (core/ring_setup.hpp).
#define io_uring_prep_timeout_remove corodist::detail::prep_timeout_remove_owned
// Its waits outlast signals, so run_for's timeout completes inside the call that armed it.
#define io_uring_wait_cqe corodist::detail::wait_cqe_through_signals
// Its io_uring_service.ipp, patched so that an I/O object closed with an
// operation in the kernel is not reused before that operation is back
// (third_party/asio/io_uring_service.ipp); src.hpp then skips the original.
#define ASIO_SOURCE // as src.hpp does
#include <asio/detail/concurrency_hint.hpp>
#include <asio/version.hpp>
#if ASIO_VERSION != 102201
#error "third_party/asio/io_uring_service.ipp is Asio 1.22.1's io_uring_service.ipp, patched: port the patch to this Asio"
#endif
#include "../../third_party/asio/io_uring_service.ipp"
#endif
#include <asio/impl/src.hpp>
#if CORODIST_IO_URING
#undef io_uring_queue_init
#undef io_uring_prep_cancel
#undef io_uring_prep_timeout_remove
#undef io_uring_wait_cqe
#endif
// The clang names of Asio's any_io_executor specialisations (g++ builds only).
#include "core/asio_clang_names.hpp"
