// The marker tokens of the reasoning modes and how a model's tokenizer and config name them.
#pragma once

#include <string>
#include <vector>

#include "data/sequences.h"
#include "model/config.h"
#include "text/tokenizer.h"

namespace coconut {

inline constexpr const char* kStartLatentToken = "<|start-latent|>";
inline constexpr const char* kEndLatentToken = "<|end-latent|>";
inline constexpr const char* kLatentToken = "<|latent|>";
inline constexpr const char* kPauseToken = "<|pause|>";

// The four markers, in the order training adds them to a tokenizer.
std::vector<std::string> reasoning_marker_tokens();

// BOS / EOS from the config (the first of each list), markers and pad from the tokenizer
// (-1 where the tokenizer lacks them; pad falls back to EOS). Throws when the config has no EOS.
SpecialTokenIds find_special_tokens(const Tokenizer& tokenizer, const LlamaConfig& config);

// Throws std::invalid_argument naming the missing markers when `mode` needs them.
void require_markers(const SpecialTokenIds& special, TrainingMode mode, const std::string& source);

}  // namespace coconut
