// A fresh temporary folder, removed afterwards.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace coconut::testing {

class TempDir {
 public:
  // One folder per instance: a test that holds two gets two (a name per test alone made them one
  // folder, the second emptying the first, and a resumed-run test compared a file with itself).
  TempDir() {
    static std::atomic<int> instances{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() / ("coconut-" + std::string(info->test_suite_name()) + "-" + info->name() +
                                                      "-" + std::to_string(::getpid()) + "-" + std::to_string(instances++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A file the tests read, inside the repository: the reasoning datasets under data/ (prontoqa/,
// prosqa/, gsm8k/, icot/), reference models, tokenizers and files under tests/fixtures/ (see the
// READMEs there for their provenance).
inline std::string test_data(const std::string& relative) {
  for (const char* dataset : {"prontoqa/", "prosqa/", "gsm8k/", "icot/"})
    if (relative.rfind(dataset, 0) == 0) return std::string(COCONUT_SOURCE_DIR) + "/data/" + relative;
  return std::string(COCONUT_SOURCE_DIR) + "/tests/fixtures/" + relative;
}

}  // namespace coconut::testing

// Expects `statement` to throw std::exception whose message contains every given substring.
#define EXPECT_THROW_WITH(statement, ...)                                                   \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << "no exception from " #statement;                                     \
    } catch (const std::exception& error) {                                                 \
      for (const std::string& expected : std::vector<std::string>{__VA_ARGS__})             \
        EXPECT_NE(std::string(error.what()).find(expected), std::string::npos)              \
            << "message '" << error.what() << "' lacks '" << expected << "'";              \
    }                                                                                       \
  } while (0)
