// Running the built `coconut` binary from a test, and reading what it wrote.
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace coconut::testing {

// `coconut ARGUMENTS` with stdout and stderr in `log`; returns the exit status.
inline int run_coconut(const std::string& arguments, const std::string& log) {
  const std::string command = std::string(COCONUT_BINARY_DIR) + "/coconut " + arguments + " >" + log + " 2>&1";
  return WEXITSTATUS(std::system(command.c_str()));
}

inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

}  // namespace coconut::testing
