// Bytes in use on glibc's heap, for tests that measure what a computation keeps alive.
#pragma once

#include <malloc.h>

#include <cstdint>

namespace coconut::testing {

// Whether glibc's allocator serves this binary: AddressSanitizer replaces malloc, and mallinfo2
// then reads 0 (the sanitizer build skips the measuring tests; the normal build runs them).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kGlibcHeap = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kGlibcHeap = false;
#else
constexpr bool kGlibcHeap = true;
#endif
#else
constexpr bool kGlibcHeap = true;
#endif

inline int64_t heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

}  // namespace coconut::testing
