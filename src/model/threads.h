// Intra-op thread count. libtorch's own default can come out as 1 on small VMs (it counts
// physical cores through cpuinfo; seen here: 1 on a 2-core machine where OpenMP itself sees 2),
// which halves every kernel. Programs call this once at start.
#pragma once

#include <cstdint>

namespace coconut {

// OMP_NUM_THREADS when set (libtorch honours it itself), else every CPU this process may run on
// less `reserved_cores` and less the cores other processes keep busy right now (busy_cores_elsewhere),
// at least one thread. Returns the count in effect.
//
// A busy neighbour: an intra-op thread that shares its core with another process makes every
// parallel region wait for it. Measured (2026-11-27, 2-core Zen 4, a Python busy loop beside
// `coconut eval` of 20 ProntoQA questions): 2 threads 1.15-1.28 s against 1 thread 0.80-0.84 s; idle,
// 2 threads 0.68-0.71 s against 0.80. The count is decided once, at start.
//
// A server reserves one core: its HTTP and client threads need a core at every token, and an
// intra-op thread that loses its core makes every parallel region wait (measured, docs/performance.md:
// the 1.6M ProntoQA model on 2 cores served one stream at 370 tokens/s with 2 threads, 1,172 with 1).
int configure_threads(int reserved_cores = 0);

// The CPUs this process may run on (its affinity mask; the hardware's count where that fails).
int available_cores();

// Tasks other than this one that are running or runnable now: the fewest of a few readings of
// /proc/loadavg's running count over about 5 ms, less this thread (0 where the file cannot be
// read). Meant for a process's start, before it has threads of its own at work.
int busy_cores_elsewhere(const char* loadavg_path = "/proc/loadavg");

// The last-level cache the first CPU shares, in bytes (sysfs; 32 MiB when the system does not say).
int64_t last_level_cache_bytes();

// Threads for a server's wide passes (serve/scheduler.h): every CPU other processes do not keep
// busy at start, or 0 (none: the usual count throughout) when OMP_NUM_THREADS is set, since then
// the user chose the count.
int wide_pass_threads();

}  // namespace coconut
