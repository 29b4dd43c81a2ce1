// Weights read whole at every decoded token stream from memory at whatever rate the CPU's address
// translation allows: on 4 KiB pages a core walks page tables for every 4 KiB it reads, on 2 MiB
// pages once per 512 times that. Measured (2026-11-30, 2-core AMD EPYC Zen 4, a stand-alone loop
// summing 256 MiB with AVX-512 loads, one thread): 16.4-17.1 GB/s on 4 KiB pages, 24.9-28.4 GB/s
// on the same bytes collapsed to 2 MiB pages; two threads 28.7 against 35.0 GB/s. A model read from
// a file mapping is on the page cache's 4 KiB pages, and the C library's heap gets 2 MiB ones only
// where the kernel is told to (transparent_hugepage "madvise", the common default).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace coconut {

// Moves the bytes of the CPU storages under `tensors` (each storage once, however many tensors
// share it; views keep their offsets) into one anonymous mapping that the kernel is asked to back
// with 2 MiB pages before it is first written (madvise MADV_HUGEPAGE); every tensor on a moved
// storage reads the new copy, with the same bits. The old memory is released as each storage moves
// (a file mapping is unmapped when nothing else holds it). Tensors off the CPU or empty are left
// alone. Returns the bytes moved (0 where the platform has no such advice: off Linux, or with
// COCONUT_HUGE_PAGES=off in the environment, which leaves every tensor where it is).
int64_t move_to_huge_pages(const std::vector<torch::Tensor>& tensors);

// Bytes of the mapping holding `address` that the kernel backs with 2 MiB pages now (its
// AnonHugePages in /proc/self/smaps; 0 where that cannot be read). For tests and benches.
int64_t huge_page_bytes_of_mapping(const void* address);

}  // namespace coconut
