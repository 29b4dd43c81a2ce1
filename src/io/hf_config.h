// config.json <-> LlamaConfig. Errors name the file, the field and the value.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "model/config.h"
#include "util/atomic_file.h"

namespace coconut {

// `source` names the file in error messages.
LlamaConfig config_from_json(const nlohmann::json& json, const std::string& source);
// A path to a config.json, or to a model folder that holds one.
LlamaConfig load_config(const std::string& path);
// HF-readable config.json (per-layer arrays written only when the model is not uniform).
nlohmann::json config_to_json(const LlamaConfig& config);

// Reads a JSON file; a missing file or malformed JSON is an error naming the file.
nlohmann::json read_json_file(const std::string& path);

}  // namespace coconut
