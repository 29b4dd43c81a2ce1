// Intra-op thread count. libtorch's own default can come out as 1 on small VMs (it counts
// physical cores through cpuinfo; seen here: 1 on a 2-core machine where OpenMP itself sees 2),
// which halves every kernel. Programs call this once at start.
#pragma once

#include <cstdint>

namespace coconut {

// OMP_NUM_THREADS when set (libtorch honours it itself), else every CPU this process may run on
// less `reserved_cores` (at least one thread). Returns the count in effect.
//
// A server reserves one core: its HTTP and client threads need a core at every token, and an
// intra-op thread that loses its core makes every parallel region wait (measured, docs/performance.md:
// the 1.6M ProntoQA model on 2 cores served one stream at 370 tokens/s with 2 threads, 1,172 with 1).
int configure_threads(int reserved_cores = 0);

// The CPUs this process may run on (its affinity mask; the hardware's count where that fails).
int available_cores();

// The last-level cache the first CPU shares, in bytes (sysfs; 32 MiB when the system does not say).
int64_t last_level_cache_bytes();

// Threads for a server's wide passes (serve/scheduler.h): every CPU, or 0 (none: the usual count
// throughout) when OMP_NUM_THREADS is set, since then the user chose the count.
int wide_pass_threads();

}  // namespace coconut
