#include "util/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace coconut {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(temporary + ": cannot open for writing");
    write(out);
    out.flush();
    if (!out) throw std::runtime_error(temporary + ": write failed (disk full?)");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) throw std::runtime_error(path + ": cannot rename from " + temporary + ": " + error.message());
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

}  // namespace coconut
