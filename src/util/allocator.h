// The C library's allocator for a process whose large tensors come and go at every step: a
// prompt's activations (megabytes each) are freed and allocated again layer after layer. glibc
// serves blocks over its mmap threshold with fresh mappings, which the kernel clears page by page
// at first touch, and trims the heap's free top back to the system; both repeat at every product.
// keep_freed_memory() raises the mmap threshold to glibc's largest (32 MiB), keeps freed memory in
// the heap (no trimming) and grows the heap 64 MiB at a time, so freed blocks are reused as they
// are. Measured (2026-11-29, 2-core Intel Xeon, bench_model, three alternating rounds each): the
// 1B-shaped Q4_K_M file, 512-token prompt, two threads, 584-601 -> 650-660 tokens/s in one set and
// within the host's noise in another, where its decode went 38-46 -> 50-56; SmolLM2's Q4_K_M file
// 402-406 -> 412-459 tokens/s prefill at one thread, at two threads and in decode within noise.
// The cost: the process keeps its peak heap until it exits (`coconut generate` on SmolLM2's file
// peaks at 675 MB against 623). Training's activations come and go the same way: the float32 step
// of bench_train's models (2 threads, 2-core Zen 4, 2026-12-01, separate processes alternating)
// took 1M 109.7-119.5 ms against 112.7-120.4 (five pairs, faster in each), 25M 2,250-2,490 against
// 2,414-2,426 (three pairs; slower in the first). The inference and training commands and the
// benches call it once at start;
// COCONUT_MALLOC=system (or glibc's own MALLOC_* tunables in the environment) leaves the allocator
// as it is.
#pragma once

namespace coconut {

// Whether the settings were applied (false off glibc, or when the environment said not to).
bool keep_freed_memory();

}  // namespace coconut
