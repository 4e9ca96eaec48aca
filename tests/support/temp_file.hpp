#pragma once
// Test helper: a fresh, empty file under /tmp (a file:// rendezvous, a
// file_store), removed when the helper goes out of scope.

#include <boost/test/unit_test.hpp>

#include <string>

#include <stdlib.h>
#include <unistd.h>

namespace corodist::test {

/// A unique, initially empty file under /tmp, removed at scope exit.
struct temp_file {
  temp_file() {
    char name[] = "/tmp/corodist_test_XXXXXX";
    const int fd = ::mkstemp(name);
    BOOST_REQUIRE_MESSAGE(fd >= 0, "mkstemp failed");
    ::close(fd);
    path = name;
  }
  ~temp_file() { ::unlink(path.c_str()); }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
  std::string path;
};

}  // namespace corodist::test
