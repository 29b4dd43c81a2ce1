// Figures: the gnuplot script a Figure becomes (data blocks, styles, labels, the baseline), and a
// real PNG through gnuplot (./run installs gnuplot-nox).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "util/gnuplot.h"

using coconut::Figure;
using coconut::PlotSeries;

TEST(Figure, ScriptHoldsEverySeriesSortedLabelledAndTheBaseline) {
  Figure figure{"accuracy vs compute", "MFLOP", "accuracy (%)", 1000, 650};
  figure.yrange = {{0, 105}};
  figure.settings = {"xtics 1"};
  PlotSeries lines{"healed", {{2, 90}, {1, 95}, {3, std::nan("")}}, "linespoints"};
  lines.sort_by_x = true;
  PlotSeries labelled{"", {{5, 50}}, "points pointtype 7"};
  labelled.labels = {"cot \"6L\""};
  figure.series = {lines, labelled};
  figure.baseline = 99.5;
  figure.baseline_title = "unpruned";
  const std::string script = coconut::figure_script(figure, "out/it's.png");

  EXPECT_NE(script.find("set terminal png size 1000,650 noenhanced\nset output 'out/it''s.png'\n"), std::string::npos) << script;
  EXPECT_NE(script.find("set title 'accuracy vs compute'\n"), std::string::npos);
  EXPECT_NE(script.find("set yrange [0:105]\n"), std::string::npos);
  EXPECT_NE(script.find("set xtics 1\n"), std::string::npos);
  // Sorted by x; the NaN point is left out (gnuplot could not draw it).
  EXPECT_NE(script.find("$s0 << EOD\n1 95\n2 90\nEOD\n"), std::string::npos) << script;
  // Labels are a quoted data column (double quotes inside become single ones).
  EXPECT_NE(script.find("$s1 << EOD\n5 50 \"cot '6L'\"\nEOD\n"), std::string::npos) << script;
  EXPECT_NE(script.find("plot $s0 using 1:2 with linespoints title 'healed', $s1 using 1:2 with points pointtype 7 notitle, "
                        "$s1 using 1:2:3 with labels offset 0,1 font ',9' notitle, 99.5 with lines dashtype 2 title 'unpruned'\n"),
            std::string::npos)
      << script;

  labelled.labels.push_back("one too many");
  figure.series = {labelled};
  try {
    coconut::figure_script(figure, "f.png");
    FAIL() << "labels that do not match the points must be refused";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("f.png"), std::string::npos) << error.what();
  }
}

TEST(Figure, GnuplotDrawsThePng) {
  const auto png = std::filesystem::temp_directory_path() / ("coconut_figure_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".png");
  std::filesystem::remove(png);
  Figure figure{"t", "x", "y"};
  figure.series = {PlotSeries{"s", {{0, 1}, {1, 2}}}};
  coconut::plot_figure(figure, png.string());
  EXPECT_GT(std::filesystem::file_size(png), 1000u);
  std::filesystem::remove(png);
}
