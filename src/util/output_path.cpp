#include "util/output_path.h"

#include <filesystem>
#include <stdexcept>

namespace coconut {

namespace fs = std::filesystem;

namespace {

// The flag that overrides the check, as the messages say it.
constexpr const char* kForceHint = "pass --force to replace it";

std::string kind_of(const fs::file_status& status) {
  switch (status.type()) {
    case fs::file_type::regular: return "a file";
    case fs::file_type::directory: return "a folder";
    case fs::file_type::symlink: return "a symbolic link";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::block:
    case fs::file_type::character: return "a device";
    case fs::file_type::socket: return "a socket";
    default: return "something other than a file";
  }
}

}  // namespace

void check_output_path(const std::string& path, OutputKind kind, const std::string& flag, bool force,
                       const std::string& own_marker) {
  if (path.empty()) return;
  std::error_code error;
  const fs::file_status status = fs::symlink_status(path, error);
  if (error || status.type() == fs::file_type::not_found) return;
  const std::string where = flag + " " + path + ": ";
  if (kind == OutputKind::kFile) {
    if (status.type() == fs::file_type::regular) return;
    if (status.type() == fs::file_type::directory)
      throw std::invalid_argument(where + "is a folder; give a file name");
    if (!force) throw std::invalid_argument(where + "exists and is " + kind_of(status) + "; " + kForceHint);
    return;
  }
  if (status.type() != fs::file_type::directory) {
    if (!force) throw std::invalid_argument(where + "exists and is " + kind_of(status) + ", not a folder; " + kForceHint);
    return;
  }
  if (force || fs::is_empty(path, error)) return;
  if (!own_marker.empty() && fs::exists(fs::path(path) / own_marker)) return;
  throw std::invalid_argument(where + "is a folder with other contents (no " +
                              (own_marker.empty() ? std::string("earlier output") : own_marker) +
                              " in it); give a new or empty folder, or " + kForceHint);
}

}  // namespace coconut
