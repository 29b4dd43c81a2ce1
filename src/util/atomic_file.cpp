#include "util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace coconut {

namespace {

// Flushes a file's (or a folder's) contents to the disk, so that a rename published after it
// never points at data still in the page cache when the machine goes down.
void sync_to_disk(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) {
    if (directory) return;  // best effort: some file systems do not open folders for syncing
    throw std::runtime_error(path + ": cannot open to sync it to disk");
  }
  const int status = ::fsync(fd);
  ::close(fd);
  if (status != 0 && !directory) throw std::runtime_error(path + ": fsync failed (disk full or I/O error?)");
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string temporary = path + ".tmp";
  // Whatever fails, the temporary goes and the target keeps its previous contents.
  try {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(temporary + ": cannot open for writing");
    write(out);
    out.flush();
    if (!out) throw std::runtime_error(path + ": write failed (disk full or file size limit?)");
    out.close();
    if (!out) throw std::runtime_error(path + ": write failed on close (disk full?)");
    sync_to_disk(temporary, false);
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    if (error) throw std::runtime_error(path + ": cannot rename from " + temporary + ": " + error.message());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  const auto parent = std::filesystem::path(path).parent_path();
  sync_to_disk(parent.empty() ? "." : parent.string(), true);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

void write_folder_atomically(const std::string& directory, const std::function<void(const std::string& staging)>& write) {
  namespace fs = std::filesystem;
  const fs::path target(directory);
  const fs::path staging = target.string() + ".tmp", previous = target.string() + ".old";
  fs::remove_all(staging);
  fs::create_directories(staging);
  try {
    write(staging.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
  fs::remove_all(previous);
  if (fs::exists(target)) fs::rename(target, previous);
  fs::rename(staging, target);
  fs::remove_all(previous);
  const auto parent = target.parent_path();
  sync_to_disk(parent.empty() ? "." : parent.string(), true);
}

}  // namespace coconut
