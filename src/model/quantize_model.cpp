#include "model/quantize_model.h"

namespace coconut {

namespace {

// The quantized copy of one projection and its Linear's weight left empty.
void quantize_projection(const torch::nn::Linear& source, torch::nn::Linear& target, QuantizedWeight& quantized) {
  quantized = quantize_q8_0(source->weight);
  target->weight.set_(torch::empty({0}, source->weight.options()));
}

}  // namespace

Llama with_quantized_weights(Llama model, WeightFormat format) {
  if (format == WeightFormat::kDense) return model;
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
    quantize_projection(from.self_attn->q_proj, attention.q_proj, attention.q_quantized);
    quantize_projection(from.self_attn->k_proj, attention.k_proj, attention.k_quantized);
    quantize_projection(from.self_attn->v_proj, attention.v_proj, attention.v_quantized);
    quantize_projection(from.self_attn->o_proj, attention.o_proj, attention.o_quantized);
    quantize_projection(from.mlp->gate_proj, mlp.gate_proj, mlp.gate_quantized);
    quantize_projection(from.mlp->up_proj, mlp.up_proj, mlp.up_quantized);
    quantize_projection(from.mlp->down_proj, mlp.down_proj, mlp.down_quantized);
    attention.q_lora = from.self_attn->q_lora, attention.k_lora = from.self_attn->k_lora;
    attention.v_lora = from.self_attn->v_lora, attention.o_lora = from.self_attn->o_lora;
    mlp.gate_lora = from.mlp->gate_lora, mlp.up_lora = from.mlp->up_lora, mlp.down_lora = from.mlp->down_lora;
  }
  quantized->output_quantized = quantize_q8_0(model->output_weight());
  if (quantized->lm_head) quantized->lm_head->weight.set_(torch::empty({0}, model->lm_head->weight.options()));
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
