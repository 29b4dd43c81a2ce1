#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <tuple>
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

// Every tensor record against the file: a known type, a size whose arithmetic does not overflow,
// rows made of whole blocks, an aligned offset, data inside the file, no two tensors overlapping.
void validate_tensor_records(const GgufFile& file, Reader& reader) {
  std::set<std::string> names;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;  // (begin, end, name) in the data section
  for (const auto& info : file.tensors) {
    const std::string where = "tensor '" + info.name + "'";
    if (!names.insert(info.name).second) reader.fail(where + " appears twice");
    const auto layout = ggml_block_layout(info.type);
    if (!layout) reader.fail(where + " has unknown ggml type " + std::to_string(info.type));
    // The product of the non-zero dimensions stays within 2^62 even when another dimension is 0
    // (then no byte count bounds the shape, and libtorch refuses to build it).
    uint64_t nonzero_product = 1;
    bool empty = false;
    for (uint64_t dim : info.dims) {
      empty = empty || dim == 0;
      if (dim != 0 && (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) || nonzero_product > (uint64_t{1} << 62)))
        reader.fail(where + ": its dimensions' product overflows (past 2^62, zeros aside)");
    }
    const uint64_t elements = empty ? 0 : nonzero_product;
    if (!info.dims.empty() && info.dims[0] % layout->elements != 0)
      reader.fail(where + ": rows of " + std::to_string(info.dims[0]) + " elements are not whole blocks of " +
                  std::to_string(layout->elements));
    uint64_t bytes = 0, end = 0;
    if (__builtin_mul_overflow(elements / layout->elements, layout->bytes, &bytes) ||
        __builtin_add_overflow(info.offset, bytes, &end) || end > reader.size() - std::min(reader.size(), file.data_offset))
      reader.fail(where + " (" + std::to_string(bytes) + " bytes at offset " + std::to_string(info.offset) +
                  ") runs past the end of the file: truncated or lying header");
    if (info.offset % file.alignment != 0)
      reader.fail(where + ": offset " + std::to_string(info.offset) + " is not a multiple of the alignment " +
                  std::to_string(file.alignment));
    spans.emplace_back(info.offset, end, info.name);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (std::get<0>(spans[i]) < std::get<1>(spans[i - 1]))
      reader.fail("tensors '" + std::get<2>(spans[i - 1]) + "' and '" + std::get<2>(spans[i]) + "' overlap");
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

const nlohmann::json* GgufFile::value(const std::string& key, const std::string& expected) const {
  const GgufMetadata* entry = find(key);
  if (!entry) return nullptr;
  const nlohmann::json& value = entry->value;
  const bool fits = expected == "string"    ? value.is_string()
                    : expected == "integer" ? value.is_number_integer()
                    : expected == "number"  ? value.is_number()
                    : expected == "bool"    ? value.is_boolean()
                                            : value.is_array();
  if (!fits) throw std::invalid_argument(path + ": metadata '" + key + "' must be " + (expected == "integer" ? "an " : "a ") + expected + ", got " + value.dump().substr(0, 80));
  return &value;
}

const nlohmann::json& GgufFile::required(const std::string& key, const std::string& expected) const {
  const nlohmann::json* found = value(key, expected);
  if (!found) throw std::invalid_argument(path + ": metadata '" + key + "' is missing");
  return *found;
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
  std::set<std::string> keys_seen;
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
    if (!keys_seen.insert(entry.key).second) reader.fail("metadata key '" + entry.key + "' appears twice");
    if (entry.key == "general.alignment") {
      if (!entry.value.is_number_unsigned()) reader.fail("general.alignment must be an unsigned integer");
      file.alignment = entry.value.get<uint64_t>();
      if (file.alignment == 0 || (file.alignment & (file.alignment - 1)) != 0 || file.alignment > (1u << 20))
        reader.fail("general.alignment must be a power of two up to 2^20");
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
  validate_tensor_records(file, reader);
  return file;
}

torch::Tensor read_gguf_tensor(const GgufFile& file, const GgufTensorInfo& info) {
  const auto plain = info.type == static_cast<uint32_t>(GgmlType::kF32)    ? std::optional(torch::kFloat32)
                     : info.type == static_cast<uint32_t>(GgmlType::kF16)  ? std::optional(torch::kFloat16)
                     : info.type == static_cast<uint32_t>(GgmlType::kBF16) ? std::optional(torch::kBFloat16)
                                                                           : std::nullopt;
  if (!plain && !ggml_type_dequantizable(info.type))
    throw std::invalid_argument(file.path + ": tensor '" + info.name + "' has ggml type " + ggml_type_name(info.type) +
                                ", which is not read here (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
                                "Q4_K, Q5_K, Q6_K are)");
  std::vector<int64_t> shape(info.dims.rbegin(), info.dims.rend());  // PyTorch order
  const BlockLayout layout = *ggml_block_layout(info.type);          // validated by read_gguf
  int64_t elements = 1;
  for (int64_t size : shape) elements *= size;
  const uint64_t bytes = static_cast<uint64_t>(elements) / layout.elements * layout.bytes;
  // Plain types land in the tensor itself; block types in a byte buffer first.
  auto tensor = torch::empty(shape, torch::TensorOptions().dtype(plain.value_or(torch::kFloat32)));
  std::vector<uint8_t> blocks(plain ? 0 : bytes);
  std::ifstream in(file.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(file.data_offset + info.offset));
  in.read(plain ? static_cast<char*>(tensor.data_ptr()) : reinterpret_cast<char*>(blocks.data()), static_cast<std::streamsize>(bytes));
  if (!in) throw std::invalid_argument(file.path + ": cannot read tensor '" + info.name + "'");
  if (!plain) dequantize_ggml(info.type, blocks.data(), elements, tensor.data_ptr<float>());
  return tensor;
}

torch::Tensor read_gguf_blocks(const GgufFile& file, const GgufTensorInfo& info) {
  if (info.dims.size() != 2) throw std::invalid_argument(file.path + ": tensor '" + info.name + "' is not a matrix");
  const BlockLayout layout = *ggml_block_layout(info.type);  // validated by read_gguf
  if (info.dims[0] % layout.elements != 0)
    throw std::invalid_argument(file.path + ": tensor '" + info.name + "' has rows of " + std::to_string(info.dims[0]) +
                                " values, not whole blocks of " + ggml_type_name(info.type));
  const auto rows = static_cast<int64_t>(info.dims[1]), row_bytes = static_cast<int64_t>(info.dims[0] / layout.elements * layout.bytes);
  auto blocks = torch::empty({rows, row_bytes}, torch::kUInt8);  // [rows, bytes a row]
  std::ifstream in(file.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(file.data_offset + info.offset));
  in.read(reinterpret_cast<char*>(blocks.data_ptr<uint8_t>()), static_cast<std::streamsize>(rows * row_bytes));
  if (!in) throw std::invalid_argument(file.path + ": cannot read tensor '" + info.name + "'");
  return blocks;
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
  const auto type = dtype == torch::kFloat32 ? GgmlType::kF32 : dtype == torch::kFloat16 ? GgmlType::kF16 : GgmlType::kBF16;
  tensors_.push_back({name, tensor.detach().cpu().contiguous(), static_cast<uint32_t>(type), tensor.sizes().vec()});
}

void GgufWriter::add_blocks(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape, const torch::Tensor& bytes) {
  const auto layout = ggml_block_layout(ggml_type);
  int64_t elements = 1;
  for (int64_t size : shape) elements *= size;
  if (!layout || shape.empty() || shape.back() % static_cast<int64_t>(layout->elements) != 0 || bytes.scalar_type() != torch::kUInt8 ||
      bytes.numel() != elements / static_cast<int64_t>(layout->elements) * static_cast<int64_t>(layout->bytes))
    throw std::invalid_argument("GGUF tensor '" + name + "': " + std::to_string(bytes.numel()) + " bytes are not whole " +
                                ggml_type_name(ggml_type) + " blocks of its shape");
  tensors_.push_back({name, bytes.detach().cpu().contiguous(), ggml_type, shape});
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
  for (const auto& entry : tensors_) {
    put_string(header, entry.name);
    put<uint32_t>(header, static_cast<uint32_t>(entry.shape.size()));
    for (auto d = entry.shape.rbegin(); d != entry.shape.rend(); ++d) put<uint64_t>(header, static_cast<uint64_t>(*d));
    put<uint32_t>(header, entry.type);
    put<uint64_t>(header, offset);
    offset = align_up(offset + entry.data.nbytes(), alignment);
  }
  header.resize(align_up(header.size(), alignment), '\0');
  write_file_atomically(path, [&](std::ostream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    uint64_t written = 0;
    for (const auto& entry : tensors_) {
      out.write(static_cast<const char*>(entry.data.data_ptr()), static_cast<std::streamsize>(entry.data.nbytes()));
      written += entry.data.nbytes();
      const uint64_t padded = align_up(written, alignment);
      const std::string padding(padded - written, '\0');
      out.write(padding.data(), static_cast<std::streamsize>(padding.size()));
      written = padded;
    }
  });
}

}  // namespace coconut
