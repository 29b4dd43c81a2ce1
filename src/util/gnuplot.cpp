#include "util/gnuplot.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
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

void plot_heatmap(const std::vector<std::vector<double>>& values, const std::string& png_path, const std::string& title,
                  const std::string& xlabel, const std::string& ylabel, int y_offset, const std::string& cblabel) {
  const size_t rows = values.size(), columns = rows == 0 ? 0 : values[0].size();
  std::ostringstream script;
  script << "set terminal png size 900,700 noenhanced\nset output " << gnuplot_quote(png_path) << "\n"
         << "set title " << gnuplot_quote(title) << "\nset xlabel " << gnuplot_quote(xlabel) << "\nset ylabel "
         << gnuplot_quote(ylabel) << "\nset cblabel " << gnuplot_quote(cblabel) << "\n"
         << "set palette rgbformulae 33,13,10\nset xtics 1\nset ytics 1\n$cells << EOD\n";
  script.precision(6);
  for (size_t r = 0; r < rows; ++r)  // one filled unit box per defined cell
    for (size_t c = 0; c < values[r].size(); ++c)
      if (!std::isnan(values[r][c])) script << c << " " << static_cast<int>(r) + y_offset << " " << values[r][c] << "\n";
  script << "EOD\nset xrange [-0.5:" << columns - 0.5 << "]\nset yrange [" << y_offset - 0.5 << ":"
         << rows + y_offset - 0.5 << "]\n"
         << "plot $cells using 1:2:(0.5):(0.5):3 with boxxyerror fillstyle solid 1.0 noborder fillcolor palette notitle, "
         << "$cells using 1:2:(sprintf('%.3f', $3)) with labels font ',9' notitle\n";
  run_gnuplot(script.str(), png_path);
}

}  // namespace coconut
