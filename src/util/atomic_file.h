// Writing a file so that readers never see a partial one: write "<path>.tmp", then rename.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace coconut {

// `write` fills the stream; a failed write or rename throws, naming the file.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace coconut
