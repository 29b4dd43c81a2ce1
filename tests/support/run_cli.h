// Running the built `coconut` binary from a test, and reading what it wrote.
#pragma once

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

namespace coconut::testing {

// `coconut ARGUMENTS` with stdout and stderr in `log`; returns the exit status.
inline int run_coconut(const std::string& arguments, const std::string& log) {
  const std::string command = std::string(COCONUT_BINARY_DIR) + "/coconut " + arguments + " >" + log + " 2>&1";
  return WEXITSTATUS(std::system(command.c_str()));
}

// What `capture_coconut` brings back: the exit status and what the command wrote.
struct CliRun {
  int status;
  std::string output;
};

// `coconut ARGUMENTS` with its output captured. `redirect` picks what comes back: stdout (the
// default) or, for commands that must fail, stderr ("2>&1 >/dev/null"). Status -1 when the shell
// could not be started.
inline CliRun capture_coconut(const std::string& arguments, const std::string& redirect = "2>/dev/null") {
  const std::string command = std::string(COCONUT_BINARY_DIR) + "/coconut " + arguments + " " + redirect;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string output;
  std::array<char, 4096> buffer{};
  while (const size_t read = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), read);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), output};
}

// The JSON object a command printed (from its first '{', as `coconut eval` prints its summary), or
// a discarded value (`is_discarded()`, no keys) when there is none or it does not parse.
inline nlohmann::json printed_json(const std::string& output) {
  const auto begin = output.find('{');
  return begin == std::string::npos ? nlohmann::json(nlohmann::json::value_t::discarded)
                                    : nlohmann::json::parse(output.substr(begin), nullptr, false);
}

// `coconut ARGUMENTS` running in the background (a server), output in `log`; SIGTERM when this
// goes out of scope.
class BackgroundCoconut {
 public:
  BackgroundCoconut(const std::string& arguments, const std::string& log) {
    const std::string pid_file = log + ".pid";
    const std::string command =
        std::string(COCONUT_BINARY_DIR) + "/coconut " + arguments + " >" + log + " 2>&1 & echo $! >" + pid_file;
    if (std::system(command.c_str()) == 0) std::ifstream(pid_file) >> pid_;
  }
  ~BackgroundCoconut() {
    if (pid_ > 0) ::kill(pid_, SIGTERM);
  }
  BackgroundCoconut(const BackgroundCoconut&) = delete;
  BackgroundCoconut& operator=(const BackgroundCoconut&) = delete;
  bool started() const { return pid_ > 0; }

 private:
  int pid_ = 0;
};

inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

}  // namespace coconut::testing
