// `coconut train --nproc N`: N processes of this program on this machine, with the variables
// torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), each
// with its share of the CPU threads unless OMP_NUM_THREADS is set.
#pragma once

#include <string>
#include <vector>

namespace coconut {

// Runs `arguments` (argv[1..] of this executable) in `processes` processes and waits for all of
// them. Returns 0 when every one succeeded; otherwise the first failure's exit status, after
// stopping the others (a rank that failed would leave the rest waiting in a collective).
int launch_local_processes(int processes, const std::vector<std::string>& arguments);

}  // namespace coconut
