// Writing a file so that readers never see a partial one: write "<path>.tmp", then rename.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace coconut {

// `write` fills the stream; a failed write or rename throws, naming the file.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_file_atomically(const std::string& path, const std::string& text);

// A folder written whole or not at all: `write` fills "<directory>.tmp" (given its path), which then
// replaces `directory` (the old one moved aside first, so one complete folder exists at every
// moment). A throw from `write` removes the staging folder and leaves `directory` as it was.
void write_folder_atomically(const std::string& directory, const std::function<void(const std::string& staging)>& write);

}  // namespace coconut
