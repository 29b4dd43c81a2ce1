#include "util/gnuplot.h"

#include <algorithm>
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

std::string figure_script(const Figure& figure, const std::string& png_path) {
  std::ostringstream script;
  script.precision(10);
  script << "set terminal png size " << figure.width << "," << figure.height << " noenhanced\nset output "
         << gnuplot_quote(png_path) << "\nset title " << gnuplot_quote(figure.title) << "\nset xlabel "
         << gnuplot_quote(figure.xlabel) << "\nset ylabel " << gnuplot_quote(figure.ylabel) << "\nset grid\nset key "
         << figure.key << "\n";
  if (figure.yrange) script << "set yrange [" << figure.yrange->first << ":" << figure.yrange->second << "]\n";
  if (figure.logscale_x) script << "set logscale x\n";
  for (const auto& setting : figure.settings) script << "set " << setting << "\n";
  for (size_t s = 0; s < figure.series.size(); ++s) {
    const auto& series = figure.series[s];
    if (!series.labels.empty() && series.labels.size() != series.points.size())
      throw std::invalid_argument(png_path + ": series '" + series.title + "' has " + std::to_string(series.labels.size()) +
                                  " labels for " + std::to_string(series.points.size()) + " points");
    std::vector<size_t> order(series.points.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (series.sort_by_x)
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return series.points[a] < series.points[b]; });
    script << "$s" << s << " << EOD\n";
    for (size_t i : order) {
      if (!std::isfinite(series.points[i].first) || !std::isfinite(series.points[i].second)) continue;  // nothing to draw
      script << series.points[i].first << " " << series.points[i].second;
      if (!series.labels.empty()) {  // a data column: double quotes keep the words together
        std::string label = series.labels[i];
        std::replace(label.begin(), label.end(), '"', '\'');
        script << " \"" << label << "\"";
      }
      script << "\n";
    }
    script << "EOD\n";
  }
  script << "plot ";
  bool first = true;
  for (size_t s = 0; s < figure.series.size(); ++s) {
    const auto& series = figure.series[s];
    script << (first ? "" : ", ") << "$s" << s << " using 1:2 with " << series.style << " "
           << (series.title.empty() ? "notitle" : "title " + gnuplot_quote(series.title));
    if (!series.labels.empty()) script << ", $s" << s << " using 1:2:3 with labels " << series.label_style << " notitle";
    first = false;
  }
  if (figure.baseline)
    script << (first ? "" : ", ") << *figure.baseline << " with lines dashtype 2 "
           << (figure.baseline_title.empty() ? "notitle" : "title " + gnuplot_quote(figure.baseline_title));
  script << "\n";
  return script.str();
}

void plot_figure(const Figure& figure, const std::string& png_path) { run_gnuplot(figure_script(figure, png_path), png_path); }

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
