#include "model/quantize_model.h"

#include <stdexcept>

#include "model/ggml_blocks.h"

namespace coconut {

namespace {

// The quantized copy of one projection and its Linear's weight left empty.
void quantize_projection(const torch::nn::Linear& source, torch::nn::Linear& target, QuantizedWeight& quantized,
                         WeightFormat format) {
  quantized = quantize_weight(source->weight, format);
  target->weight.set_(torch::empty({0}, source->weight.options()));
}

// Projections that read the same input quantized as one weight of all their rows, each given its
// rows as a view, where every part but the last has whole groups of 8 rows; else one by one.
QuantizedWeight quantize_fused(const std::vector<const torch::nn::Linear*>& sources, const std::vector<torch::nn::Linear*>& targets,
                               const std::vector<QuantizedWeight*>& parts, WeightFormat format) {
  std::vector<torch::Tensor> weights;
  bool whole_groups = true;
  for (size_t i = 0; i < sources.size(); ++i) {
    weights.push_back((*sources[i])->weight);
    if (i + 1 < sources.size() && weights.back().size(0) % kQ8_0GroupRows != 0) whole_groups = false;
  }
  if (!whole_groups) {
    for (size_t i = 0; i < sources.size(); ++i) quantize_projection(*sources[i], *targets[i], *parts[i], format);
    return {};
  }
  const QuantizedWeight fused = quantize_weight(torch::cat(weights, 0), format);  // [N1 + N2 + .., K]
  int64_t first = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    *parts[i] = weight_rows(fused, first, weights[i].size(0));
    first += weights[i].size(0);
    (*targets[i])->weight.set_(torch::empty({0}, weights[i].options()));
  }
  return fused;
}

// A new model of `model`'s config sharing every parameter and buffer with it (not copied), into
// which the quantized projections go; CPU only.
Llama sharing_weights(Llama& model, const std::string& what) {
  if (!model->embed_tokens->weight.device().is_cpu())
    throw std::invalid_argument(what + " run on the CPU only; on " + model->embed_tokens->weight.device().str() + " use --weights dense");
  Llama shared = [&] {
    UninitializedWeights uninitialized;
    return Llama(model->config());
  }();
  torch::NoGradGuard no_grad;
  const auto source_parameters = model->named_parameters();
  for (auto& named : shared->named_parameters()) named.value().set_data(source_parameters[named.key()]);
  const auto source_buffers = model->named_buffers();
  for (auto& named : shared->named_buffers()) named.value().set_data(source_buffers[named.key()]);
  return shared;
}

// A layer's LoRA updates, which stay as they are beside quantized projections.
void share_adapters(DecoderLayerImpl& from, DecoderLayerImpl& to) {
  to.self_attn->q_lora = from.self_attn->q_lora, to.self_attn->k_lora = from.self_attn->k_lora;
  to.self_attn->v_lora = from.self_attn->v_lora, to.self_attn->o_lora = from.self_attn->o_lora;
  to.mlp->gate_lora = from.mlp->gate_lora, to.mlp->up_lora = from.mlp->up_lora, to.mlp->down_lora = from.mlp->down_lora;
}

}  // namespace

Llama with_quantized_weights(Llama model, WeightFormat format) {
  if (format == WeightFormat::kDense) return model;
  Llama quantized = sharing_weights(model, weight_format_name(format) + " weights");
  torch::NoGradGuard no_grad;
  for (size_t index = 0; index < model->layers->size(); ++index) {
    auto& from = *model->layers[index]->as<DecoderLayer>();
    auto& to = *quantized->layers[index]->as<DecoderLayer>();
    auto& attention = *to.self_attn;
    auto& mlp = *to.mlp;
    attention.qkv_quantized =
        quantize_fused({&from.self_attn->q_proj, &from.self_attn->k_proj, &from.self_attn->v_proj},
                       {&attention.q_proj, &attention.k_proj, &attention.v_proj},
                       {&attention.q_quantized, &attention.k_quantized, &attention.v_quantized}, format);
    quantize_projection(from.self_attn->o_proj, attention.o_proj, attention.o_quantized, format);
    mlp.gate_up_quantized = quantize_fused({&from.mlp->gate_proj, &from.mlp->up_proj}, {&mlp.gate_proj, &mlp.up_proj},
                                           {&mlp.gate_quantized, &mlp.up_quantized}, format);
    quantize_projection(from.mlp->down_proj, mlp.down_proj, mlp.down_quantized, format);
    share_adapters(from, to);
  }
  // The output head stays Q8_0 in every format, as llama.cpp's 4-bit files keep it at 8 bits or more
  // (SmolLM2's Q4_1 file: token_embd, tied to the head, is Q8_0).
  quantized->output_quantized = quantize_q8_0(model->output_weight());
  if (quantized->lm_head) quantized->lm_head->weight.set_(torch::empty({0}, model->lm_head->weight.options()));
  quantized->train(model->is_training());
  return quantized;
}

std::optional<WeightFormat> weight_format_of_ggml_type(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ8_0: return WeightFormat::kQ8_0;
    case GgmlType::kQ4_0: return WeightFormat::kQ4_0;
    case GgmlType::kQ4_1: return WeightFormat::kQ4_1;
    case GgmlType::kQ5_0: return WeightFormat::kQ5_0;
    case GgmlType::kQ4_K: return WeightFormat::kQ4_K;
    case GgmlType::kQ5_K: return WeightFormat::kQ5_K;
    case GgmlType::kQ6_K: return WeightFormat::kQ6_K;
    default: return std::nullopt;
  }
}

namespace {

// The blocks of `name` as a weight [out_features, in_features], or an undefined weight when there are none.
QuantizedWeight weight_from_blocks(const std::map<std::string, FileBlocks>& blocks, const std::string& name, int64_t out_features,
                                   int64_t in_features) {
  const auto found = blocks.find(name);
  if (found == blocks.end()) return {};
  try {
    return from_ggml_blocks(found->second.rows, out_features, in_features, found->second.format);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(name + ": " + error.what());
  }
}

// Projections that read the same input as one product over all their rows, when their blocks share
// a format (and, for the grouped formats, every part but the last has whole groups of 8 rows); else
// each its own. A projection without blocks keeps its dense weight.
QuantizedWeight fuse_file_blocks(const std::map<std::string, FileBlocks>& blocks, const std::vector<std::string>& names,
                                 const std::vector<const torch::nn::Linear*>& sources, const std::vector<torch::nn::Linear*>& targets,
                                 const std::vector<QuantizedWeight*>& parts) {
  std::vector<QuantizedWeight> weights;
  bool fusable = true;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& options = (*sources[i])->options;  // the shape (the weight itself may be held empty)
    weights.push_back(weight_from_blocks(blocks, names[i], options.out_features(), options.in_features()));
    fusable = fusable && weights.back().defined() && weights.back().format == weights.front().format &&
              (held_as_ggml_rows(weights.back().format) || i + 1 == names.size() || weights.back().out_features % kQ8_0GroupRows == 0);
  }
  const auto empty_linear = [&](size_t i) { (*targets[i])->weight.set_(torch::empty({0}, (*sources[i])->weight.options())); };
  if (!fusable) {
    for (size_t i = 0; i < names.size(); ++i)
      if (weights[i].defined()) {
        *parts[i] = weights[i];
        empty_linear(i);
      }
    return {};
  }
  std::vector<torch::Tensor> rows;
  int64_t total = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    rows.push_back(blocks.at(names[i]).rows.reshape({weights[i].out_features, -1}));
    total += weights[i].out_features;
  }
  const QuantizedWeight fused = from_ggml_blocks(torch::cat(rows, 0), total, weights.front().in_features, weights.front().format);
  int64_t first = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    *parts[i] = weight_rows(fused, first, weights[i].out_features);
    first += weights[i].out_features;
    empty_linear(i);
  }
  return fused;
}

}  // namespace

Llama with_file_blocks(Llama model, const std::map<std::string, FileBlocks>& blocks, const std::vector<int64_t>& source_layers) {
  Llama quantized = sharing_weights(model, "a GGUF file's blocks");
  torch::NoGradGuard no_grad;
  for (size_t index = 0; index < model->layers->size(); ++index) {
    const int64_t source = source_layers.empty() ? static_cast<int64_t>(index) : source_layers.at(index);
    const std::string prefix = "layers." + std::to_string(source) + ".";
    auto& from = *model->layers[index]->as<DecoderLayer>();
    auto& to = *quantized->layers[index]->as<DecoderLayer>();
    auto& attention = *to.self_attn;
    auto& mlp = *to.mlp;
    attention.qkv_quantized = fuse_file_blocks(
        blocks, {prefix + "self_attn.q_proj.weight", prefix + "self_attn.k_proj.weight", prefix + "self_attn.v_proj.weight"},
        {&from.self_attn->q_proj, &from.self_attn->k_proj, &from.self_attn->v_proj}, {&attention.q_proj, &attention.k_proj, &attention.v_proj},
        {&attention.q_quantized, &attention.k_quantized, &attention.v_quantized});
    fuse_file_blocks(blocks, {prefix + "self_attn.o_proj.weight"}, {&from.self_attn->o_proj}, {&attention.o_proj}, {&attention.o_quantized});
    mlp.gate_up_quantized = fuse_file_blocks(blocks, {prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"},
                                             {&from.mlp->gate_proj, &from.mlp->up_proj}, {&mlp.gate_proj, &mlp.up_proj},
                                             {&mlp.gate_quantized, &mlp.up_quantized});
    fuse_file_blocks(blocks, {prefix + "mlp.down_proj.weight"}, {&from.mlp->down_proj}, {&mlp.down_proj}, {&mlp.down_quantized});
    share_adapters(from, to);
  }
  const int64_t vocabulary = model->config().vocab_size, width = model->config().hidden_size;
  // The embedding table on its blocks (looked up row by row), shared with the head when tied.
  quantized->embedding_quantized = weight_from_blocks(blocks, "embed_tokens.weight", vocabulary, width);
  if (quantized->embedding_quantized.defined())
    quantized->embed_tokens->weight.set_(torch::empty({0}, model->embed_tokens->weight.options()));
  quantized->output_quantized =
      model->lm_head ? weight_from_blocks(blocks, "lm_head.weight", vocabulary, width) : quantized->embedding_quantized;
  const auto head_dense = model->output_weight();
  if (!quantized->output_quantized.defined()) {
    if (head_dense.numel() == 0)
      throw std::invalid_argument(std::string(model->lm_head ? "lm_head.weight" : "embed_tokens.weight") +
                                  ": held empty, and the file gives no blocks for the output head");
    quantized->output_quantized = quantize_q8_0(head_dense);
  }
  if (quantized->lm_head) quantized->lm_head->weight.set_(torch::empty({0}, model->lm_head->weight.options()));
  quantized->train(model->is_training());
  return quantized;
}

namespace {

// The blocks the model's projections, head and table hold (each once).
std::vector<torch::Tensor> held_blocks(Llama& model) {
  std::vector<torch::Tensor> blocks;
  auto add = [&](const QuantizedWeight& weight) {
    if (weight.defined()) blocks.push_back(weight.packed);
  };
  for (const auto& layer : *model->layers) {
    const auto& decoder = *layer->as<DecoderLayer>();
    for (const auto* weight : {&decoder.self_attn->q_quantized, &decoder.self_attn->k_quantized, &decoder.self_attn->v_quantized,
                               &decoder.self_attn->o_quantized, &decoder.mlp->gate_quantized, &decoder.mlp->up_quantized,
                               &decoder.mlp->down_quantized})
      add(*weight);
  }
  add(model->output_quantized);
  if (!model->embedding_quantized.packed.is_same(model->output_quantized.packed)) add(model->embedding_quantized);
  return blocks;
}

}  // namespace

int64_t held_weight_bytes(Llama& model) {
  int64_t bytes = 0;
  for (const auto& parameter : model->parameters()) bytes += parameter.numel() * parameter.element_size();
  for (const auto& blocks : held_blocks(model)) bytes += blocks.numel();
  return bytes;
}

std::vector<torch::Tensor> held_weight_tensors(Llama& model) {
  std::vector<torch::Tensor> tensors = model->parameters();
  for (const auto& buffer : model->buffers()) tensors.push_back(buffer);
  for (const auto& blocks : held_blocks(model)) tensors.push_back(blocks);
  return tensors;
}

}  // namespace coconut
