// keep_freed_memory (util/allocator.h): blocks of several MiB in varied sizes, as a prompt's
// activations are, freed and allocated again. With glibc's defaults every round maps fresh pages
// that the kernel clears (minor page faults, counted by getrusage: about 20,000 a round here);
// after keep_freed_memory the second round reuses the first's memory.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/allocator.h"

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Minor faults of one round: blocks of 8, 24, 16, 30 and 4 MiB allocated, written and freed.
long faults_of_a_round() {
  const size_t sizes[] = {8u << 20, 24u << 20, 16u << 20, 30u << 20, 4u << 20};
  char* blocks[5];
  const long before = minor_faults();
  for (int i = 0; i < 5; ++i) {
    blocks[i] = static_cast<char*>(std::malloc(sizes[i]));
    std::memset(blocks[i], 1, sizes[i]);
  }
  for (int i = 4; i >= 0; --i) std::free(blocks[i]);
  return minor_faults() - before;
}

// The second round's faults in a child process, which keeps the allocator as this one has it.
long faults_of_a_second_round_in_a_child() {
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    faults_of_a_round();
    const long faults = faults_of_a_round();
    if (write(pipe_ends[1], &faults, sizeof faults) != sizeof faults) _exit(1);
    _exit(0);
  }
  long faults = -1;
  if (read(pipe_ends[0], &faults, sizeof faults) != sizeof faults) faults = -1;
  waitpid(child, nullptr, 0);
  close(pipe_ends[0]), close(pipe_ends[1]);
  return faults;
}

}  // namespace

TEST(Allocator, FreedBlocksAreReusedWithoutFreshPages) {
#if defined(__GLIBC__)
  const long by_default = faults_of_a_second_round_in_a_child();
  ASSERT_TRUE(coconut::keep_freed_memory());
  faults_of_a_round();
  const long kept = faults_of_a_round();
  std::printf("minor faults of a second round of 82 MiB: %ld by default, %ld with freed memory kept\n", by_default, kept);
  EXPECT_GT(by_default, 10000);  // fresh pages every round
  EXPECT_LT(kept, 200);
#else
  EXPECT_FALSE(coconut::keep_freed_memory());
#endif
}
