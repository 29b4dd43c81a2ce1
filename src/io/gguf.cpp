#include "io/gguf.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "util/atomic_file.h"

namespace coconut {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringBytes = 1ULL << 30;
constexpr uint64_t kMaxCount = 1ULL << 32;

class Reader {
 public:
  Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw std::invalid_argument(path + ": cannot open");
    size_ = std::filesystem::file_size(path);
  }
  void read(void* data, uint64_t bytes, const char* what) {
    if (position_ + bytes > size_)
      fail(std::string("truncated: ") + what + " at byte " + std::to_string(position_) + " runs past the end (" +
           std::to_string(size_) + " bytes)");
    in_.read(static_cast<char*>(data), static_cast<std::streamsize>(bytes));
    position_ += bytes;
  }
  template <typename T>
  T get(const char* what) {
    T value;
    read(&value, sizeof value, what);
    return value;
  }
  std::string string(const char* what) {
    const auto length = get<uint64_t>(what);
    if (length > kMaxStringBytes || position_ + length > size_)
      fail(std::string("a ") + what + " claims " + std::to_string(length) + " bytes, more than the file holds");
    std::string text(length, '\0');
    read(text.data(), length, what);
    return text;
  }
  [[noreturn]] void fail(const std::string& problem) const { throw std::invalid_argument(path_ + ": " + problem); }
  uint64_t position() const { return position_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0, position_ = 0;
};

nlohmann::json read_scalar(Reader& reader, GgufValueType type, const std::string& key) {
  switch (type) {
    case GgufValueType::kUint8: return reader.get<uint8_t>("u8");
    case GgufValueType::kInt8: return reader.get<int8_t>("i8");
    case GgufValueType::kUint16: return reader.get<uint16_t>("u16");
    case GgufValueType::kInt16: return reader.get<int16_t>("i16");
    case GgufValueType::kUint32: return reader.get<uint32_t>("u32");
    case GgufValueType::kInt32: return reader.get<int32_t>("i32");
    case GgufValueType::kFloat32: return reader.get<float>("f32");
    case GgufValueType::kBool: return reader.get<uint8_t>("bool") != 0;
    case GgufValueType::kString: return reader.string("string value");
    case GgufValueType::kUint64: return reader.get<uint64_t>("u64");
    case GgufValueType::kInt64: return reader.get<int64_t>("i64");
    case GgufValueType::kFloat64: return reader.get<double>("f64");
    default: reader.fail("metadata '" + key + "' has unknown value type " + std::to_string(static_cast<uint32_t>(type)));
  }
}

uint64_t element_bytes(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return 4;   // F32
    case 1: return 2;   // F16
    case 30: return 2;  // BF16
    default: return 0;  // quantized or unknown: not sized here
  }
}

torch::ScalarType scalar_type_of(uint32_t ggml_type, const std::string& path, const std::string& name) {
  switch (ggml_type) {
    case 0: return torch::kFloat32;
    case 1: return torch::kFloat16;
    case 30: return torch::kBFloat16;
    default:
      throw std::invalid_argument(path + ": tensor '" + name + "' has ggml type " + std::to_string(ggml_type) +
                                  " (only F32, F16 and BF16 are read)");
  }
}

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// Little-endian appends.
template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void put_string(std::string& out, const std::string& text) {
  put<uint64_t>(out, text.size());
  out += text;
}

void put_scalar(std::string& out, GgufValueType type, const nlohmann::json& value, const std::string& key) {
  switch (type) {
    case GgufValueType::kUint8: put<uint8_t>(out, value.get<uint8_t>()); break;
    case GgufValueType::kInt8: put<int8_t>(out, value.get<int8_t>()); break;
    case GgufValueType::kUint16: put<uint16_t>(out, value.get<uint16_t>()); break;
    case GgufValueType::kInt16: put<int16_t>(out, value.get<int16_t>()); break;
    case GgufValueType::kUint32: put<uint32_t>(out, value.get<uint32_t>()); break;
    case GgufValueType::kInt32: put<int32_t>(out, value.get<int32_t>()); break;
    case GgufValueType::kFloat32: put<float>(out, value.get<float>()); break;
    case GgufValueType::kBool: put<uint8_t>(out, value.get<bool>() ? 1 : 0); break;
    case GgufValueType::kString: put_string(out, value.get<std::string>()); break;
    case GgufValueType::kUint64: put<uint64_t>(out, value.get<uint64_t>()); break;
    case GgufValueType::kInt64: put<int64_t>(out, value.get<int64_t>()); break;
    case GgufValueType::kFloat64: put<double>(out, value.get<double>()); break;
    default: throw std::invalid_argument("GGUF metadata '" + key + "': cannot write value type here");
  }
}

}  // namespace

const GgufMetadata* GgufFile::find(const std::string& key) const {
  for (const auto& entry : metadata)
    if (entry.key == key) return &entry;
  return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& tensor : tensors)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

GgufFile read_gguf(const std::string& path) {
  Reader reader(path);
  GgufFile file;
  file.path = path;
  if (reader.get<uint32_t>("magic") != kMagic) reader.fail("not a GGUF file (bad magic)");
  file.version = reader.get<uint32_t>("version");
  if (file.version < 2 || file.version > 3) reader.fail("unsupported GGUF version " + std::to_string(file.version));
  const auto tensor_count = reader.get<uint64_t>("tensor count");
  const auto metadata_count = reader.get<uint64_t>("metadata count");
  if (tensor_count > kMaxCount || metadata_count > kMaxCount) reader.fail("implausible tensor or metadata count");
  for (uint64_t i = 0; i < metadata_count; ++i) {
    GgufMetadata entry;
    entry.key = reader.string("metadata key");
    entry.type = static_cast<GgufValueType>(reader.get<uint32_t>("value type"));
    if (entry.type == GgufValueType::kArray) {
      entry.element_type = static_cast<GgufValueType>(reader.get<uint32_t>("array type"));
      const auto count = reader.get<uint64_t>("array length");
      if (count > reader.size()) reader.fail("metadata '" + entry.key + "' claims " + std::to_string(count) + " elements");
      entry.value = nlohmann::json::array();
      for (uint64_t j = 0; j < count; ++j) entry.value.push_back(read_scalar(reader, entry.element_type, entry.key));
    } else {
      entry.value = read_scalar(reader, entry.type, entry.key);
    }
    if (entry.key == "general.alignment") {
      file.alignment = entry.value.get<uint64_t>();
      if (file.alignment == 0 || (file.alignment & (file.alignment - 1)) != 0) reader.fail("general.alignment must be a power of two");
    }
    file.metadata.push_back(std::move(entry));
  }
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    info.name = reader.string("tensor name");
    const auto dims = reader.get<uint32_t>("tensor dimension count");
    if (dims > 8) reader.fail("tensor '" + info.name + "' has " + std::to_string(dims) + " dimensions");
    for (uint32_t d = 0; d < dims; ++d) info.dims.push_back(reader.get<uint64_t>("tensor dimension"));
    info.type = reader.get<uint32_t>("tensor type");
    info.offset = reader.get<uint64_t>("tensor offset");
    file.tensors.push_back(std::move(info));
  }
  file.data_offset = align_up(reader.position(), file.alignment);
  for (const auto& info : file.tensors) {
    const uint64_t bytes_per = element_bytes(info.type);
    if (bytes_per == 0) continue;  // quantized types: sizes not checked here
    uint64_t elements = 1;
    for (auto d : info.dims) elements *= d;
    if (file.data_offset + info.offset + elements * bytes_per > reader.size())
      reader.fail("tensor '" + info.name + "' (" + std::to_string(elements * bytes_per) + " bytes at offset " +
                  std::to_string(info.offset) + ") runs past the end of the file: truncated or lying header");
  }
  return file;
}

torch::Tensor read_gguf_tensor(const GgufFile& file, const GgufTensorInfo& info) {
  const auto dtype = scalar_type_of(info.type, file.path, info.name);
  std::vector<int64_t> shape(info.dims.rbegin(), info.dims.rend());  // PyTorch order
  auto tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  std::ifstream in(file.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(file.data_offset + info.offset));
  in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
  if (!in) throw std::invalid_argument(file.path + ": cannot read tensor '" + info.name + "'");
  return tensor;
}

void GgufWriter::add(const std::string& key, GgufValueType type, nlohmann::json value) {
  metadata_.push_back({key, type, GgufValueType::kUint32, std::move(value)});
}

void GgufWriter::add_array(const std::string& key, GgufValueType element_type, nlohmann::json values) {
  metadata_.push_back({key, GgufValueType::kArray, element_type, std::move(values)});
}

void GgufWriter::add_tensor(const std::string& name, const torch::Tensor& tensor) {
  const auto dtype = tensor.scalar_type();
  if (dtype != torch::kFloat32 && dtype != torch::kFloat16 && dtype != torch::kBFloat16)
    throw std::invalid_argument("GGUF tensor '" + name + "': only float32, float16 and bfloat16 are written");
  tensors_.emplace_back(name, tensor.detach().cpu().contiguous());
}

void GgufWriter::write(const std::string& path) const {
  constexpr uint64_t alignment = 32;
  std::string header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, 3);
  put<uint64_t>(header, tensors_.size());
  put<uint64_t>(header, metadata_.size());
  for (const auto& entry : metadata_) {
    put_string(header, entry.key);
    put<uint32_t>(header, static_cast<uint32_t>(entry.type));
    if (entry.type == GgufValueType::kArray) {
      put<uint32_t>(header, static_cast<uint32_t>(entry.element_type));
      put<uint64_t>(header, entry.value.size());
      for (const auto& item : entry.value) put_scalar(header, entry.element_type, item, entry.key);
    } else {
      put_scalar(header, entry.type, entry.value, entry.key);
    }
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors_) {
    put_string(header, name);
    put<uint32_t>(header, static_cast<uint32_t>(tensor.dim()));
    for (int64_t d = tensor.dim() - 1; d >= 0; --d) put<uint64_t>(header, static_cast<uint64_t>(tensor.size(d)));
    const auto type = tensor.scalar_type() == torch::kFloat32 ? GgmlType::kF32
                      : tensor.scalar_type() == torch::kFloat16 ? GgmlType::kF16 : GgmlType::kBF16;
    put<uint32_t>(header, static_cast<uint32_t>(type));
    put<uint64_t>(header, offset);
    offset = align_up(offset + tensor.nbytes(), alignment);
  }
  header.resize(align_up(header.size(), alignment), '\0');
  write_file_atomically(path, [&](std::ostream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    uint64_t written = 0;
    for (const auto& [name, tensor] : tensors_) {
      out.write(static_cast<const char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
      written += tensor.nbytes();
      const uint64_t padded = align_up(written, alignment);
      const std::string padding(padded - written, '\0');
      out.write(padding.data(), static_cast<std::streamsize>(padding.size()));
      written = padded;
    }
  });
}

}  // namespace coconut
