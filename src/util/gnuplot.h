// Plots through gnuplot (a PNG per call): the script is piped to `gnuplot`; a missing gnuplot or
// a failing script is an error naming the output file.
#pragma once

#include <string>

namespace coconut {

// Runs `script` (which must `set output` to `png_path` itself) and checks that the PNG exists.
void run_gnuplot(const std::string& script, const std::string& png_path);

// Quotes a path for a gnuplot string literal.
std::string gnuplot_quote(const std::string& text);

}  // namespace coconut
