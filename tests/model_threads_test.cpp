// The default thread count leaves out the cores other processes keep busy at start.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "model/threads.h"
#include "support/temp_dir.h"

namespace coconut {
namespace {

TEST(Threads, BusyCoresElsewhereReadsTheRunningCountLessItself) {
  testing::TempDir dir;
  std::ofstream(dir.file("loadavg")) << "0.50 0.40 0.30 3/120 4567\n";
  EXPECT_EQ(busy_cores_elsewhere(dir.file("loadavg").c_str()), 2);
  std::ofstream(dir.file("alone")) << "0.00 0.01 0.05 1/98 4567\n";
  EXPECT_EQ(busy_cores_elsewhere(dir.file("alone").c_str()), 0);
  std::ofstream(dir.file("garbled")) << "not a loadavg\n";
  EXPECT_EQ(busy_cores_elsewhere(dir.file("garbled").c_str()), 0);
  EXPECT_EQ(busy_cores_elsewhere(dir.file("missing").c_str()), 0);
}

// A process spinning beside this one is always runnable, so it is always counted.
TEST(Threads, ASpinningNeighbourIsSeen) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    volatile unsigned long spins = 0;
    for (;;) ++spins;
  }
  usleep(50000);
  const int busy = busy_cores_elsewhere();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_GE(busy, 1);
}

}  // namespace
}  // namespace coconut
