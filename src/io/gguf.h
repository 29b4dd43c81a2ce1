// GGUF v3 (the file format of llama.cpp / ggml): a reader and a writer for the parts a Llama
// needs (metadata of every type; tensors read as F32/F16/BF16 or dequantized from ggml's block
// formats, written as F32/F16/BF16). Errors name the file and the problem.
//
// Layout: "GGUF", version u32, tensor count u64, metadata count u64; metadata (key string, type
// u32, value); tensor infos (name, n_dims u32, dims u64 x n in ggml order = innermost first, ggml
// type u32, offset u64 from the data section); padding to `general.alignment` (default 32); data.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/ggml_blocks.h"

namespace coconut {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

struct GgufMetadata {
  std::string key;
  GgufValueType type = GgufValueType::kUint32;
  GgufValueType element_type = GgufValueType::kUint32;  // arrays only
  nlohmann::json value;  // number, bool, string, or array of them
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the innermost (a row's length)
  uint32_t type = 0;           // ggml type id (any known to ggml; read_gguf_tensor converts those ggml_blocks.h lists)
  uint64_t offset = 0;         // from the start of the data section
};

struct GgufFile {
  std::string path;
  uint32_t version = 3;
  std::vector<GgufMetadata> metadata;
  std::vector<GgufTensorInfo> tensors;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // absolute offset of the data section

  const GgufMetadata* find(const std::string& key) const;
  // The value of `key` when present, checked to be what the caller expects: a "string", an
  // "integer" (signed or not), a "number", a "bool" or an "array"; a value of another kind is an
  // error naming the file and the key.
  const nlohmann::json* value(const std::string& key, const std::string& expected) const;
  // The same for a key that must be there.
  const nlohmann::json& required(const std::string& key, const std::string& expected) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;
};

// Reads the header, metadata and tensor infos (not the data); checks that every tensor lies
// inside the file.
GgufFile read_gguf(const std::string& path);

// One tensor's data in PyTorch order (dims reversed): F32/F16/BF16 as float32/float16/bfloat16,
// the quantized block types dequantized to float32. Another type is refused by its name.
torch::Tensor read_gguf_tensor(const GgufFile& file, const GgufTensorInfo& info);
// A 2-D tensor's bytes as the file holds them: uint8 [rows, bytes a row] (a row's blocks in order).
torch::Tensor read_gguf_blocks(const GgufFile& file, const GgufTensorInfo& info);

// Collects metadata and tensors, then writes the file atomically (temp file + rename).
class GgufWriter {
 public:
  void add(const std::string& key, GgufValueType type, nlohmann::json value);
  void add_array(const std::string& key, GgufValueType element_type, nlohmann::json values);
  // `tensor` in PyTorch order, stored as F32, F16 or BF16 (its own dtype must be one of them).
  void add_tensor(const std::string& name, const torch::Tensor& tensor);
  // A tensor of `shape` (PyTorch order) in a block type, as its bytes in ggml's layout (uint8);
  // std::invalid_argument when they are not whole blocks of that shape.
  void add_blocks(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape, const torch::Tensor& bytes);
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    torch::Tensor data;  // float values, or uint8 blocks
    uint32_t type;       // ggml type id
    std::vector<int64_t> shape;
  };
  std::vector<GgufMetadata> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace coconut
