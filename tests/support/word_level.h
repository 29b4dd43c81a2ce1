// A word-level tokenizer for tests whose first eight ids are the special tokens of the reasoning
// layout, and the SpecialTokenIds that name them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "text/hf_tokenizer.h"

namespace coconut::testing {

// Ids 0-7: <pad> <bos> <eos> <unk> <|start-latent|> <|end-latent|> <|latent|> <|pause|>; then the
// words of `texts`.
inline std::unique_ptr<HfTokenizer> word_level_with_markers(const std::vector<std::string>& texts) {
  return build_word_level_tokenizer(texts, {"<pad>", "<bos>", "<eos>", "<unk>", "<|start-latent|>", "<|end-latent|>",
                                            "<|latent|>", "<|pause|>"});
}

inline SpecialTokenIds marker_ids() {
  SpecialTokenIds special;
  special.pad = 0;
  special.bos = 1;
  special.eos = 2;
  special.start_latent = 4;
  special.end_latent = 5;
  special.latent = 6;
  special.pause = 7;
  return special;
}

}  // namespace coconut::testing
