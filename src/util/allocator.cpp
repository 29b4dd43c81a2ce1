#include "util/allocator.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace coconut {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  const char* choice = std::getenv("COCONUT_MALLOC");
  if (choice != nullptr && std::strcmp(choice, "system") == 0) return false;
  for (const char* tunable : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"})
    if (std::getenv(tunable) != nullptr) return false;  // the user's settings stand
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 && mallopt(M_TOP_PAD, 64 << 20) == 1;
#else
  return false;
#endif
}

}  // namespace coconut
