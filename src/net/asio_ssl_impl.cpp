// The one translation unit that compiles Asio's SSL support
// (ASIO_SEPARATE_COMPILATION; OpenSSL underneath).
#include <asio/ssl/impl/src.hpp>
