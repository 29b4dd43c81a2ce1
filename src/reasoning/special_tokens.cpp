#include "reasoning/special_tokens.h"

#include <stdexcept>

namespace coconut {

std::vector<std::string> reasoning_marker_tokens() {
  return {kStartLatentToken, kEndLatentToken, kLatentToken, kPauseToken};
}

SpecialTokenIds find_special_tokens(const Tokenizer& tokenizer, const LlamaConfig& config) {
  if (config.eos_token_ids.empty()) throw std::invalid_argument("model config has no eos_token_id");
  SpecialTokenIds special;
  if (!config.bos_token_ids.empty()) special.bos = config.bos_token_ids.front();
  special.eos = config.eos_token_ids.front();
  const auto id = [&](const char* token) { return tokenizer.token_to_id(token).value_or(-1); };
  special.start_latent = id(kStartLatentToken);
  special.end_latent = id(kEndLatentToken);
  special.latent = id(kLatentToken);
  special.pause = id(kPauseToken);
  special.pad = tokenizer.token_to_id("<pad>").value_or(special.eos);
  return special;
}

void require_markers(const SpecialTokenIds& special, TrainingMode mode, const std::string& source) {
  std::string missing;
  const auto need = [&](int64_t id, const char* token) {
    if (id < 0) missing += std::string(missing.empty() ? "" : ", ") + token;
  };
  switch (mode) {
    case TrainingMode::kCoconut:
      need(special.start_latent, kStartLatentToken);
      need(special.end_latent, kEndLatentToken);
      need(special.latent, kLatentToken);
      break;
    case TrainingMode::kNoThoughts:
      need(special.start_latent, kStartLatentToken);
      need(special.end_latent, kEndLatentToken);
      break;
    case TrainingMode::kPauseAsThought:
      need(special.start_latent, kStartLatentToken);
      need(special.end_latent, kEndLatentToken);
      need(special.pause, kPauseToken);
      break;
    case TrainingMode::kPause:
      need(special.pause, kPauseToken);
      break;
    default:
      break;
  }
  if (!missing.empty())
    throw std::invalid_argument(source + ": mode " + training_mode_name(mode) + " needs the tokens " + missing +
                                ", which the tokenizer lacks");
}

}  // namespace coconut
