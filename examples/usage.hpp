#pragma once
// The examples' command line: each prints its usage on --help (or -h) and
// exits 0, and refuses an argument it does not know with a message and
// status 2, before it touches the network.

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace examples {

/// True for "--help" and "-h".
inline bool is_help(std::string_view arg) { return arg == "--help" || arg == "-h"; }

/// Prints "usage: PROGRAM USAGE" and `about` to stdout (help) or the usage and
/// `error` to stderr; returns the exit status (0 for help, 2 for an error).
inline int print_usage(const char* program, const char* usage, const char* about, const char* error = nullptr) {
  if (error) {
    std::fprintf(stderr, "%s: %s\nusage: %s %s\n(--help for more)\n", program, error, program, usage);
    return 2;
  }
  std::printf("usage: %s %s\n\n%s\n", program, usage, about);
  return 0;
}

/// For an example that takes no arguments: nullopt when there are none, else
/// the status to exit with (after the usage, or an error naming the argument).
inline std::optional<int> no_arguments(int argc, char** argv, const char* about) {
  if (argc <= 1)
    return std::nullopt;
  if (is_help(argv[1]))
    return print_usage(argv[0], "", about);
  const std::string error = "unknown argument '" + std::string(argv[1]) + "' (this example takes none)";
  return print_usage(argv[0], "", about, error.c_str());
}

} // namespace examples
