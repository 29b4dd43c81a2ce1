// libFuzzer entry point for one target of targets.h, chosen at build time (COCONUT_FUZZ_TARGET).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  coconut::fuzz::COCONUT_FUZZ_TARGET(data, size);  // accepted or refused: both fine
  return 0;
}
