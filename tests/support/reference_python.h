// Running a reference script of tests/reference/ in the test venv (.venv-test, which `./run test`
// makes): gguf-py, HF tokenizers / transformers, jinja2 and the openai client, independent of our
// code. A missing venv fails the test, naming the command that makes it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace coconut::testing {

inline std::string reference_python() { return std::string(COCONUT_SOURCE_DIR) + "/.venv-test/bin/python"; }

// `python tests/reference/SCRIPT ARGUMENTS` with its output in `log`; fails the test (and returns
// false) when the venv is missing or the script fails, showing the log.
inline bool run_reference(const std::string& script, const std::string& arguments, const std::string& log) {
  if (!std::filesystem::exists(reference_python())) {
    ADD_FAILURE() << reference_python() << " is missing: `./run test` makes the test venv";
    return false;
  }
  const std::string command = reference_python() + " " + std::string(COCONUT_SOURCE_DIR) + "/tests/reference/" + script + " " +
                              arguments + " >" + log + " 2>&1";
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::ifstream file(log);
    ADD_FAILURE() << script << " failed (" << status << "):\n" << std::string(std::istreambuf_iterator<char>(file), {});
    return false;
  }
  return true;
}

}  // namespace coconut::testing
