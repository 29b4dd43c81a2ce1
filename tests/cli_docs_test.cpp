// Docs that cannot rot: docs/cli.md is what docs/write_cli_reference.sh makes of the built binary's
// --help, and every `coconut SUBCOMMAND --flag` written in a code block of README.md or docs/
// names a subcommand and flags that binary has.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "support/run_cli.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using coconut::testing::read_text;

const std::string kSource = COCONUT_SOURCE_DIR;

TEST(Docs, CliReferenceIsCurrent) {
  coconut::testing::TempDir dir;
  const std::string command = kSource + "/docs/write_cli_reference.sh " + COCONUT_BINARY_DIR + "/coconut " + dir.file("cli.md");
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_TRUE(read_text(dir.file("cli.md")) == read_text(kSource + "/docs/cli.md"))
      << "docs/cli.md is not what the binary's --help says: `./run docs` writes it again";
}

// A command written in a code block: its subcommand and the --flags on its line and on the
// indented lines that continue it (starting with "[" or "--"), comments left out.
struct DocCommand {
  std::string file, subcommand;
  std::set<std::string> flags;
  int line;
};

std::vector<DocCommand> commands_in(const fs::path& markdown) {
  static const std::regex invocation(R"((?:^|[\s/])coconut ([a-z][a-z-]*))");
  static const std::regex flag(R"(--[a-z][a-z0-9-]*)");
  std::vector<DocCommand> commands;
  std::istringstream text(read_text(markdown.string()));
  bool in_block = false;
  int number = 0;
  for (std::string line; std::getline(text, line);) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (!in_block) continue;
    const size_t comment = line.find(" #");
    const std::string code = line.substr(0, comment);
    const size_t first = code.find_first_not_of(' ');
    if (first == std::string::npos || code[first] == '#') continue;
    std::smatch match;
    if (std::regex_search(code, match, invocation)) {
      commands.push_back({markdown.string(), match[1].str(), {}, number});
    } else if (commands.empty() || commands.back().file != markdown.string() || first == 0 ||
               (code[first] != '[' && code.compare(first, 2, "--") != 0)) {
      continue;
    }
    for (auto it = std::sregex_iterator(code.begin(), code.end(), flag); it != std::sregex_iterator(); ++it)
      commands.back().flags.insert(it->str());
  }
  return commands;
}

TEST(Docs, CommandsInCodeBlocksUseRealFlags) {
  std::vector<fs::path> pages = {kSource + "/README.md"};
  for (const auto& entry : fs::recursive_directory_iterator(kSource + "/docs"))
    if (entry.path().extension() == ".md" && entry.path().filename() != "cli.md") pages.push_back(entry.path());
  std::map<std::string, coconut::testing::CliRun> help;
  int checked = 0;
  for (const auto& page : pages)
    for (const DocCommand& command : commands_in(page)) {
      if (!help.count(command.subcommand)) help[command.subcommand] = coconut::testing::capture_coconut(command.subcommand + " --help");
      const auto& known = help[command.subcommand];
      const std::string where = command.file.substr(kSource.size() + 1) + ":" + std::to_string(command.line);
      // An unknown subcommand's --help is the main help (exit 0), whose usage line has no subcommand.
      if (known.status != 0 || !std::regex_search(known.output, std::regex("Usage: \\S*coconut " + command.subcommand + " "))) {
        ADD_FAILURE() << where << ": no subcommand 'coconut " << command.subcommand << "'";
        continue;
      }
      for (const std::string& name : command.flags) {
        const std::regex listed("(^|[\\s,])" + name + "([\\s,{]|$)");
        EXPECT_TRUE(std::regex_search(known.output, listed)) << where << ": 'coconut " << command.subcommand << "' has no flag " << name;
      }
      ++checked;
    }
  EXPECT_GE(checked, 20) << "the docs' code blocks should hold the command reference";
}

}  // namespace
