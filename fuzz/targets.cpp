#include "targets.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "data/example.h"
#include "io/gguf.h"
#include "io/gguf_import.h"
#include "io/gguf_tokenizer.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "recipes/train_config.h"
#include "serve/connection_gate.h"
#include "text/hf_tokenizer.h"
#include "util/json_text.h"

namespace coconut::fuzz {
namespace {

std::string as_text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// The loaders read files: the input goes to a per-process file under /tmp (or $TMPDIR), removed after.
class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size, const std::string& extension) {
    const char* folder = std::getenv("TMPDIR");
    path_ = std::string(folder && *folder ? folder : "/tmp") + "/coconut-fuzz-" + std::to_string(getpid()) + extension;
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) throw std::logic_error("fuzz: cannot write " + path_);  // not the input's fault: a finding
  }
  ~InputFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A refusal is a std::runtime_error, std::invalid_argument or std::out_of_range (the error kinds
// our loaders throw, nlohmann's parse errors included); a std::logic_error of another kind, or
// anything not a std::exception, escapes and is reported.
// Returns whether the body ran without a refusal.
template <typename Body>
bool refusals_are_fine(Body&& body) {
  try {
    body();
    return true;
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  } catch (const std::out_of_range&) {
  } catch (const nlohmann::json::exception&) {
  }
  return false;
}

}  // namespace

// Accepted: the file loads. A text the vocabulary cannot spell is then refused, which is fine too.
bool tokenizer_json(const uint8_t* data, size_t size) {
  std::unique_ptr<HfTokenizer> tokenizer;
  if (!refusals_are_fine([&] { tokenizer = HfTokenizer::from_json(parse_json_text(as_text(data, size), "fuzz.json"), "fuzz.json"); }))
    return false;
  refusals_are_fine([&] {
    const auto ids = tokenizer->encode("Every brimpus is not wooden. Alex is a brimpus.\n 12 <s> caf\xc3\xa9 \xff");
    tokenizer->decode(ids);
  });
  return true;
}

bool safetensors(const uint8_t* data, size_t size) {
  return refusals_are_fine([&] {
    InputFile file(data, size, ".safetensors");
    read_safetensors(file.path());
  });
}

bool gguf(const uint8_t* data, size_t size) {
  return refusals_are_fine([&] {
    InputFile file(data, size, ".gguf");
    const GgufFile gguf = read_gguf(file.path());
    for (const auto& info : gguf.tensors) read_gguf_tensor(gguf, info);  // quantized blocks dequantized
    // What import-gguf reads of the metadata: each refusal is fine, each on its own.
    refusals_are_fine([&] { config_from_gguf(gguf); });
    refusals_are_fine([&] { HfTokenizer::from_json(tokenizer_from_gguf(gguf).tokenizer, "tokenizer.ggml")->encode("a b 12"); });
  });
}

bool model_config(const uint8_t* data, size_t size) {
  return refusals_are_fine([&] { config_from_json(parse_json_text(as_text(data, size), "config.json"), "config.json"); });
}

bool dataset(const uint8_t* data, size_t size) {
  if (size == 0) return false;
  static const char* const extensions[] = {".json", ".jsonl", ".txt"};
  return refusals_are_fine([&] {
    InputFile file(data + 1, size - 1, extensions[data[0] % 3]);
    load_dataset(file.path());
  });
}

bool train_config(const uint8_t* data, size_t size) {
  return refusals_are_fine([&] { train_config_from_yaml_text(as_text(data, size), "fuzz.yaml"); });
}

// The server's framing of raw request bytes (what every client's bytes meet first): whatever it
// answers must be consistent with the bytes (a complete request ends inside them).
bool http_framing(const uint8_t* data, size_t size) {
  const std::string bytes = as_text(data, size);
  size_t request_bytes = 0;
  if (serve::frame_request(bytes, 512, 256, &request_bytes) == serve::Framing::kComplete && request_bytes > bytes.size())
    throw std::logic_error("frame_request: a complete request of " + std::to_string(request_bytes) + " bytes in " +
                           std::to_string(bytes.size()));
  return true;
}

const std::vector<NamedTarget>& targets() {
  static const std::vector<NamedTarget> all = {{"tokenizer_json", tokenizer_json}, {"safetensors", safetensors},
                                                {"gguf", gguf},
                                                {"model_config", model_config},
                                                {"dataset", dataset},
                                                {"train_config", train_config},
                                                {"http_framing", http_framing}};
  return all;
}

}  // namespace coconut::fuzz
