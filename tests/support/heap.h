// Bytes in use on glibc's heap, for tests that measure what a computation keeps alive.
#pragma once

#include <malloc.h>

#include <cstdint>

namespace coconut::testing {

inline int64_t heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

}  // namespace coconut::testing
