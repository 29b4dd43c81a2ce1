// Plots through gnuplot (a PNG per call): the script is piped to `gnuplot`; a missing gnuplot or
// a failing script is an error naming the output file.
#pragma once

#include <string>
#include <vector>

namespace coconut {

// Runs `script` (which must `set output` to `png_path` itself) and checks that the PNG exists.
void run_gnuplot(const std::string& script, const std::string& png_path);

// Quotes a path for a gnuplot string literal.
std::string gnuplot_quote(const std::string& text);

// A heatmap of `values[row][column]` with each cell's value printed in it (NaN cells left blank,
// so a triangular matrix draws right): x = column, y = row + y_offset.
void plot_heatmap(const std::vector<std::vector<double>>& values, const std::string& png_path, const std::string& title,
                  const std::string& xlabel, const std::string& ylabel, int y_offset, const std::string& cblabel);

}  // namespace coconut
