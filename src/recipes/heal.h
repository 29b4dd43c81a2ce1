// `coconut heal`: fine-tune a pruned model with the training procedure, in the layout it was
// trained for. The model's coconut.json fills what the YAML leaves out (mode, curriculum stage,
// thoughts per step, ...), so a pruned Coconut model heals at its final stage, with its thoughts;
// `distill_from` (usually the unpruned model) adds the teacher's soft targets.
#pragma once

#include <ostream>

#include "recipes/train.h"
#include "recipes/train_config.h"

namespace coconut {

// `config` with the reasoning settings of its load_model_path for every key it does not give; the
// mode is lm (the plain next-token loss, data/text_documents.h) when train_path is plain text.
// Throws std::invalid_argument naming the config when load_model_path is missing.
TrainConfig heal_config(TrainConfig config);

TrainSummary heal(const TrainConfig& config, std::ostream& progress);

}  // namespace coconut
