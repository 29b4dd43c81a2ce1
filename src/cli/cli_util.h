// Small helpers shared by subcommands: parsing id lists and choosing devices/dtypes.
#pragma once

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

// --weights of eval, generate, serve and logits.
inline constexpr const char* kWeightsHelp =
    "auto | dense | q8_0 | q4_0 | q4_1 | gguf: q8_0, q4_0, q4_1 keep the projections in ggml's blocks of that format and "
    "the output head in Q8_0 (CPU; q8_0 reads about half the bytes of bf16 per token, q4_1 about 0.3; a GGUF file's own "
    "blocks come back bit for bit). gguf: each projection on the blocks of the GGUF file the folder was imported from, in "
    "the file's own format (Q4_K, Q5_K, Q6_K, Q5_0, Q8_0, ...; import-gguf keeps them for a file of mixed blocks). "
    "auto: the model's own format (coconut.json `weights`, which import-gguf writes: the format when every projection is "
    "Q8_0, Q4_0 or Q4_1, gguf for the k-quants and other mixes), dense with --adapter, on a GPU or without one";
// The values --weights accepts.
inline const std::vector<std::string> kWeightFormats = {"auto", "dense", "q8_0", "q4_0", "q4_1", "gguf"};

namespace coconut::cli {

// "1,2,3" -> {1, 2, 3}; anything else is an error naming the flag.
std::vector<int64_t> parse_ids(const std::string& text, const std::string& flag);
std::string join_ids(const std::vector<int64_t>& ids);
// "cpu", "cuda", "cuda:1"; "auto" = cuda when available.
torch::Device parse_device(const std::string& name);
// The layers eval and eval-lm remove at load from a `layers`-layer model: --drop-layers (e.g. 1,5)
// or --depth K (the layers K..; "full" or "" none), not both. Anything else is an error naming the flag.
std::set<int64_t> layers_to_remove(const std::string& drop_layers, const std::string& depth, int64_t layers);
// "" = the model's own dtype.
std::optional<torch::ScalarType> parse_optional_dtype(const std::string& name);

// Flag checks (CLI11 validators; they run only on values given on the command line, so a sentinel
// default such as -1 = "the model's own" stays available). Each rejects NaN and infinities.
// A number in [low, high].
CLI::Validator in_range(double low, double high);
// A number in (low, high].
CLI::Validator above_up_to(double low, double high);
// The largest token count a flag accepts (decoding limits, contexts): far above any model here, far
// below what would allocate a KV cache the machine cannot hold.
constexpr int64_t kMaxTokensFlag = 1 << 20;

}  // namespace coconut::cli
