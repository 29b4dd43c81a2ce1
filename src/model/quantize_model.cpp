#include "model/quantize_model.h"

#include <stdexcept>

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

}  // namespace

Llama with_quantized_weights(Llama model, WeightFormat format) {
  if (format == WeightFormat::kDense) return model;
  if (!model->embed_tokens->weight.device().is_cpu())
    throw std::invalid_argument(weight_format_name(format) + " weights run on the CPU only; on " +
                                model->embed_tokens->weight.device().str() + " use --weights dense");
  Llama quantized = [&] {
    UninitializedWeights uninitialized;
    return Llama(model->config());
  }();
  torch::NoGradGuard no_grad;
  const auto source_parameters = model->named_parameters();
  for (auto& named : quantized->named_parameters()) named.value().set_data(source_parameters[named.key()]);
  const auto source_buffers = model->named_buffers();
  for (auto& named : quantized->named_buffers()) named.value().set_data(source_buffers[named.key()]);
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
    attention.q_lora = from.self_attn->q_lora, attention.k_lora = from.self_attn->k_lora;
    attention.v_lora = from.self_attn->v_lora, attention.o_lora = from.self_attn->o_lora;
    mlp.gate_lora = from.mlp->gate_lora, mlp.up_lora = from.mlp->up_lora, mlp.down_lora = from.mlp->down_lora;
  }
  // The output head stays Q8_0 in every format, as llama.cpp's 4-bit files keep it at 8 bits or more
  // (SmolLM2's Q4_1 file: token_embd, tied to the head, is Q8_0).
  quantized->output_quantized = quantize_q8_0(model->output_weight());
  if (quantized->lm_head) quantized->lm_head->weight.set_(torch::empty({0}, model->lm_head->weight.options()));
  quantized->train(model->is_training());
  return quantized;
}

int64_t held_weight_bytes(Llama& model) {
  int64_t bytes = 0;
  for (const auto& parameter : model->parameters()) bytes += parameter.numel() * parameter.element_size();
  auto add = [&](const QuantizedWeight& weight) {
    if (weight.defined()) bytes += weight.packed.numel();
  };
  for (const auto& layer : *model->layers) {
    const auto& decoder = *layer->as<DecoderLayer>();
    for (const auto* weight : {&decoder.self_attn->q_quantized, &decoder.self_attn->k_quantized, &decoder.self_attn->v_quantized,
                               &decoder.self_attn->o_quantized, &decoder.mlp->gate_quantized, &decoder.mlp->up_quantized,
                               &decoder.mlp->down_quantized})
      add(*weight);
  }
  add(model->output_quantized);
  return bytes;
}

}  // namespace coconut
