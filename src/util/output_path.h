// Output paths a user names (--out, output_dir): what the tools may replace there.
#pragma once

#include <string>

namespace coconut {

enum class OutputKind { kFile, kFolder };

// Throws (naming `flag` and the path) unless `path` may be written:
//  - kFile: absent, or a regular file (replaced). A folder, symlink, FIFO or device is refused.
//  - kFolder: absent, an empty folder, or a folder holding `own_marker` (a file the tool writes
//    there, so the folder is its own earlier output). A file, a symlink or any other folder is refused.
// `force` allows replacing anything but a folder with a file.
void check_output_path(const std::string& path, OutputKind kind, const std::string& flag, bool force,
                       const std::string& own_marker = "");

}  // namespace coconut
