#include "model/kv_cache.h"

#include <stdexcept>
#include <string>

namespace coconut {

torch::ScalarType attention_dtype(torch::ScalarType model_dtype, torch::Device device) {
  return device.is_cpu() ? torch::kFloat32 : model_dtype;
}

KVCache KVCache::preallocated(const LlamaConfig& config, int64_t batch, int64_t capacity, torch::ScalarType dtype,
                              torch::Device device) {
  KVCache cache;
  cache.preallocated_ = true;
  cache.capacity_ = capacity;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    // [B, G, capacity, Dh]
    cache.keys_.push_back(torch::zeros({batch, config.kv_heads(layer), capacity, config.head_dim}, options));
    cache.values_.push_back(torch::zeros({batch, config.kv_heads(layer), capacity, config.head_dim}, options));
  }
  cache.key_mask_ = torch::zeros({batch, capacity}, torch::TensorOptions().dtype(torch::kBool).device(device));
  return cache;
}

KVCache KVCache::growing(const LlamaConfig& config) {
  KVCache cache;
  cache.keys_.resize(config.num_hidden_layers);
  cache.values_.resize(config.num_hidden_layers);
  return cache;
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t new_columns = k.size(2);
  const auto index = static_cast<size_t>(layer);
  if (preallocated_) {
    if (length_ + new_columns > capacity_)
      throw std::out_of_range("KV cache full: " + std::to_string(length_) + " + " + std::to_string(new_columns) +
                              " columns exceed capacity " + std::to_string(capacity_));
    keys_[index].narrow(2, length_, new_columns).copy_(k);
    values_[index].narrow(2, length_, new_columns).copy_(v);
    return {keys_[index].narrow(2, 0, length_ + new_columns), values_[index].narrow(2, 0, length_ + new_columns)};
  }
  keys_[index] = keys_[index].defined() ? torch::cat({keys_[index], k}, 2) : k;
  values_[index] = values_[index].defined() ? torch::cat({values_[index], v}, 2) : v;
  return {keys_[index], values_[index]};
}

torch::Tensor KVCache::append_key_mask(const torch::Tensor& new_mask) {
  const int64_t new_columns = new_mask.size(1);
  if (preallocated_) {
    if (length_ + new_columns > capacity_)
      throw std::out_of_range("KV cache full: cannot add " + std::to_string(new_columns) + " columns");
    key_mask_.narrow(1, length_, new_columns).copy_(new_mask);
    return key_mask_.narrow(1, 0, length_ + new_columns);
  }
  // The growing cache keeps exactly `length_` columns of mask; drop any rewound tail first.
  key_mask_ = key_mask_.defined() ? torch::cat({key_mask_.narrow(1, 0, length_), new_mask.to(torch::kBool)}, 1)
                                  : new_mask.to(torch::kBool);
  return key_mask_;
}

void KVCache::truncate(int64_t length) {
  if (length < 0 || length > length_) throw std::out_of_range("KVCache::truncate beyond its length");
  if (!preallocated_) {
    for (auto& k : keys_)
      if (k.defined()) k = k.narrow(2, 0, length);
    for (auto& v : values_)
      if (v.defined()) v = v.narrow(2, 0, length);
    if (key_mask_.defined()) key_mask_ = key_mask_.narrow(1, 0, length);
  }
  length_ = length;
}

}  // namespace coconut
