#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  // Every float32 product on the tiles unless the caller says otherwise: the kernels' own tests
  // check each path, tests/model_cpu_product_choice_test.cpp the measured choice, and results
  // compared across processes must not hang on a measurement.
  setenv("COCONUT_CPU_KERNELS", "tiles", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
