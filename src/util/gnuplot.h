// Every figure the project draws, through gnuplot (a PNG per call): a `Figure` of series (lines,
// points, bars, labelled points) or a heatmap. The script is piped to `gnuplot`; a missing gnuplot
// or a failing script is an error naming the output file.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace coconut {

// Runs `script` (which must `set output` to `png_path` itself) and checks that the PNG exists.
void run_gnuplot(const std::string& script, const std::string& png_path);

// Quotes a path for a gnuplot string literal.
std::string gnuplot_quote(const std::string& text);

// One data set of a figure, drawn `with` a gnuplot style ("linespoints", "points pointtype 7
// pointsize 1.3", "boxes", "lines linewidth 2 linecolor 'black'"). With `labels` (one per point),
// each point also gets its text beside it, in `label_style` ("offset 0,1.2 font ',10'").
struct PlotSeries {
  std::string title;  // the key's entry; empty: none
  std::vector<std::pair<double, double>> points;
  std::string style = "linespoints";
  std::vector<std::string> labels;
  std::string label_style = "offset 0,1 font ',9'";
  bool sort_by_x = false;
};

struct Figure {
  std::string title, xlabel, ylabel;
  int width = 900, height = 600;
  std::optional<std::pair<double, double>> yrange;  // empty: gnuplot's choice
  bool logscale_x = false;
  std::string key = "outside right font ',9'";     // gnuplot's `set key` ("off" for none)
  std::vector<std::string> settings;               // further `set` lines, e.g. "xtics 1", "style fill solid"
  std::vector<PlotSeries> series;
  std::optional<double> baseline;                  // a dashed horizontal line
  std::string baseline_title;
};

// The gnuplot script that draws `figure` into `png_path` (exposed for tests), and drawing it.
std::string figure_script(const Figure& figure, const std::string& png_path);
void plot_figure(const Figure& figure, const std::string& png_path);

// A heatmap of `values[row][column]` with each cell's value printed in it (NaN cells left blank,
// so a triangular matrix draws right): x = column, y = row + y_offset.
void plot_heatmap(const std::vector<std::vector<double>>& values, const std::string& png_path, const std::string& title,
                  const std::string& xlabel, const std::string& ylabel, int y_offset, const std::string& cblabel);

}  // namespace coconut
