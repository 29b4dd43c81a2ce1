#include "model/huge_pages.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace coconut {

namespace {

#if defined(__linux__)
constexpr int64_t kHugePage = 2 << 20;
constexpr int64_t kSlotAlignment = 64;  // each storage starts on a cache line

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// One anonymous mapping, unmapped when the last storage moved into it is freed.
struct Arena {
  void* base = nullptr;
  int64_t bytes = 0;
  ~Arena() {
    if (base != nullptr) munmap(base, static_cast<size_t>(bytes));
  }
};

// A storage's DataPtr context: a share of the arena.
void release_share(void* share) { delete static_cast<std::shared_ptr<Arena>*>(share); }

// `bytes` (a multiple of 2 MiB) at a 2 MiB-aligned address, advised to 2 MiB pages; nullptr when
// the kernel refuses the mapping.
std::shared_ptr<Arena> map_arena(int64_t bytes) {
  // Map one huge page more and cut the ends so that the start is aligned: the kernel backs only
  // aligned 2 MiB ranges with huge pages.
  const size_t mapped = static_cast<size_t>(bytes + kHugePage);
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + mapped, aligned_end = aligned + static_cast<uintptr_t>(bytes);
  if (end > aligned_end) munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  auto arena = std::make_shared<Arena>();
  arena->base = reinterpret_cast<void*>(aligned);
  arena->bytes = bytes;
  // Advice only: where the kernel has transparent huge pages off, the mapping still works on 4 KiB pages.
  madvise(arena->base, static_cast<size_t>(bytes), MADV_HUGEPAGE);
  return arena;
}
#endif

}  // namespace

int64_t move_to_huge_pages(const std::vector<torch::Tensor>& tensors) {
#if defined(__linux__)
  const char* choice = std::getenv("COCONUT_HUGE_PAGES");
  if (choice != nullptr && std::strcmp(choice, "off") == 0) return 0;
  // Each storage once, in the order first met, with its slot in the arena.
  std::vector<c10::StorageImpl*> storages;
  std::unordered_map<c10::StorageImpl*, int64_t> offsets;
  int64_t total = 0;
  for (const auto& tensor : tensors) {
    if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.has_storage()) continue;
    c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    if (storage->nbytes() == 0 || storage->data() == nullptr || offsets.count(storage)) continue;
    offsets[storage] = total;
    storages.push_back(storage);
    total += round_up(static_cast<int64_t>(storage->nbytes()), kSlotAlignment);
  }
  if (total == 0) return 0;
  const auto arena = map_arena(round_up(total, kHugePage));
  if (!arena) return 0;
  auto* base = static_cast<char*>(arena->base);
  for (c10::StorageImpl* storage : storages) {
    char* slot = base + offsets[storage];
    std::memcpy(slot, storage->data(), storage->nbytes());
    // The old DataPtr is freed here (its memory or mapping released); every tensor on the storage
    // now reads the slot.
    storage->set_data_ptr_noswap(c10::DataPtr(slot, new std::shared_ptr<Arena>(arena), &release_share, c10::Device(c10::kCPU)));
  }
  return total;
#else
  (void)tensors;
  return 0;
#endif
}

int64_t huge_page_bytes_of_mapping(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    uintptr_t first = 0, last = 0;
    char dash = 0;
    std::istringstream fields(line);
    // A mapping's header: "start-end perms offset dev inode [path]" in hexadecimal.
    if (fields >> std::hex >> first >> dash >> last && dash == '-' && line.find(':') > line.find(' ')) {
      inside = target >= first && target < last;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      int64_t kib = 0;
      std::istringstream(line.substr(14)) >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace coconut
