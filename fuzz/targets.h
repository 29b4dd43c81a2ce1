// Fuzz targets: one function per parser of untrusted input, each taking arbitrary bytes. A target
// returns normally whether the input parses or is refused with a clear error (an exception derived
// from std::exception); anything else (a crash, a sanitizer report, a hang, another exception)
// is a finding. The libFuzzer mains (fuzz_main.cpp) and the unit suite's replay of
// tests/fuzz_regressions/ call the same functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace coconut::fuzz {

using Target = bool (*)(const uint8_t* data, size_t size);

struct NamedTarget {
  const char* name;  // also the folder of its seeds (fuzz/corpus/<name>) and regressions
  Target run;
};

// Every target, in a fixed order.
const std::vector<NamedTarget>& targets();

bool tokenizer_json(const uint8_t* data, size_t size);  // tokenizer.json, then encode and decode a text
bool safetensors(const uint8_t* data, size_t size);     // a model.safetensors file
bool gguf(const uint8_t* data, size_t size);            // a GGUF file: header, metadata, tensor records, tensors
bool model_config(const uint8_t* data, size_t size);    // config.json
bool dataset(const uint8_t* data, size_t size);         // first byte picks the format: .json, .jsonl or .txt
bool train_config(const uint8_t* data, size_t size);    // a training YAML config

}  // namespace coconut::fuzz
