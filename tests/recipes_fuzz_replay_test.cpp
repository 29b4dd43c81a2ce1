// The fuzz targets (fuzz/targets.h) in the unit suite:
// - every seed of fuzz/corpus/<target>/ is accepted, so the fuzzer starts from inputs that reach
//   past the first check;
// - every input under tests/fuzz_regressions/<target>/ (inputs that once crashed, hung, allocated
//   absurdly, leaked, or were accepted although malformed) runs to a clean result: refused, or
//   accepted where its name says ".accepted." (a valid file that once leaked on a later step).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "../fuzz/targets.h"

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<fs::path> files_in(const fs::path& folder) {
  std::vector<fs::path> files;
  if (fs::is_directory(folder))
    for (const auto& entry : fs::directory_iterator(folder))
      if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(FuzzReplay, EverySeedIsAccepted) {
  ASSERT_EQ(coconut::fuzz::targets().size(), 7u);
  for (const auto& target : coconut::fuzz::targets()) {
    const auto seeds = files_in(fs::path(COCONUT_SOURCE_DIR) / "fuzz" / "corpus" / target.name);
    ASSERT_FALSE(seeds.empty()) << "no seeds for " << target.name;
    for (const auto& seed : seeds) {
      const auto bytes = read_bytes(seed);
      EXPECT_TRUE(target.run(bytes.data(), bytes.size())) << seed;
    }
  }
}

TEST(FuzzReplay, EveryPastFindingIsRefusedCleanly) {
  size_t replayed = 0;
  for (const auto& target : coconut::fuzz::targets()) {
    for (const auto& input : files_in(fs::path(COCONUT_SOURCE_DIR) / "tests" / "fuzz_regressions" / target.name)) {
      const auto bytes = read_bytes(input);
      const bool valid = input.filename().string().find(".accepted.") != std::string::npos;
      EXPECT_EQ(target.run(bytes.data(), bytes.size()), valid) << input << (valid ? " was refused" : " was accepted");
      ++replayed;
    }
  }
  EXPECT_GE(replayed, 19u);
}
