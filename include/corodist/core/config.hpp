#pragma once
/// \file
/// The compile-time checks every public header makes first: a translation
/// unit that uses corodist must be C++20 and must see the macros the library
/// was built with (Asio is compiled once, inside libcorodist; a TU that sees
/// a different Asio configuration compiles and links but disagrees with the
/// library at run time — it may hang). The flags come from
/// `pkg-config --cflags corodist`, the CMake target `corodist::corodist`, or
/// the Meson dependency `corodist` (docs/install.md).

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "corodist needs C++20: compile with -std=c++20 (or newer)"
#endif

#if !defined(ASIO_STANDALONE) || !defined(ASIO_SEPARATE_COMPILATION) || !defined(ASIO_NO_DEPRECATED) || \
    !defined(ASIO_DISABLE_STD_ALIGNED_ALLOC) || !defined(MSGPACK_NO_BOOST) || !defined(CORODIST_IO_URING)
#error "corodist: compile with the library's flags, `pkg-config --cflags corodist` (-DASIO_STANDALONE -DASIO_SEPARATE_COMPILATION -DASIO_NO_DEPRECATED -DASIO_DISABLE_STD_ALIGNED_ALLOC -DMSGPACK_NO_BOOST -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1 -DCORODIST_IO_URING=..., plus -DASIO_HAS_IO_URING -DASIO_DISABLE_EPOLL in the io_uring build); they must match the library's Asio"
#endif

#if CORODIST_IO_URING && (!defined(ASIO_HAS_IO_URING) || !defined(ASIO_DISABLE_EPOLL))
#error "corodist was built on io_uring: compile with -DASIO_HAS_IO_URING -DASIO_DISABLE_EPOLL (`pkg-config --cflags corodist`)"
#endif
#if !CORODIST_IO_URING && defined(ASIO_HAS_IO_URING)
#error "corodist was built on epoll (-Dio_uring=disabled): compile without -DASIO_HAS_IO_URING (`pkg-config --cflags corodist`)"
#endif

#include <asio/detail/config.hpp>

#if !defined(ASIO_HAS_CO_AWAIT) || !defined(ASIO_HAS_STD_COROUTINE)
#error "corodist needs Asio's C++20 coroutines: compile with -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1 (clang with libstdc++ needs them; `pkg-config --cflags corodist` has them)"
#endif
