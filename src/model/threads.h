// Intra-op thread count. libtorch's own default can come out as 1 on small VMs (it counts
// physical cores through cpuinfo; seen here: 1 on a 2-core machine where OpenMP itself sees 2),
// which halves every kernel. Programs call this once at start.
#pragma once

namespace coconut {

// OMP_NUM_THREADS when set (libtorch honours it itself), else every CPU this process may run on.
// Returns the count in effect.
int configure_threads();

}  // namespace coconut
