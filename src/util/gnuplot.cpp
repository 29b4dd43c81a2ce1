#include "util/gnuplot.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace coconut {

std::string gnuplot_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') quoted += "''";
    else quoted += c;
  }
  return quoted + "'";
}

void run_gnuplot(const std::string& script, const std::string& png_path) {
  std::filesystem::remove(png_path);
  FILE* pipe = popen("gnuplot 2>&1", "w");
  if (pipe == nullptr) throw std::runtime_error(png_path + ": cannot start gnuplot");
  const bool written = std::fwrite(script.data(), 1, script.size(), pipe) == script.size();
  const int status = pclose(pipe);
  if (!written || status != 0)
    throw std::runtime_error(png_path + ": gnuplot failed (exit status " + std::to_string(status) +
                             "; is gnuplot installed? ./run installs gnuplot-nox)");
  if (!std::filesystem::exists(png_path)) throw std::runtime_error(png_path + ": gnuplot wrote no file");
}

}  // namespace coconut
