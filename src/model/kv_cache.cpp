#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
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

KVCache KVCache::fixed(const LlamaConfig& config, int64_t batch, int64_t capacity, torch::ScalarType dtype,
                       torch::Device device) {
  if (batch < 1 || capacity < 1) throw std::invalid_argument("KVCache::fixed: batch and capacity must be positive");
  KVCache cache = preallocated(config, batch, capacity, dtype, device);
  cache.fixed_ = true;
  cache.next_column_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  return cache;
}

KVCache KVCache::per_row(const LlamaConfig& config, int64_t rows, int64_t capacity, torch::ScalarType dtype,
                         torch::Device device) {
  if (rows < 1 || capacity < 1) throw std::invalid_argument("KVCache::per_row: rows and capacity must be positive");
  KVCache cache = preallocated(config, rows, capacity, dtype, device);
  cache.per_row_ = true;
  cache.row_lengths_.assign(static_cast<size_t>(rows), 0);
  cache.row_hidden_ends_.assign(static_cast<size_t>(rows), 0);
  cache.row_count_ = rows;
  return cache;
}

int64_t KVCache::length() const {
  if (per_row_) throw std::logic_error("KVCache::length: a per-row cache has one length per row (row_length)");
  return length_;
}

void KVCache::select_rows(int64_t first, int64_t count) {
  if (!per_row_) throw std::logic_error("KVCache::select_rows: not a per-row cache");
  const auto rows = static_cast<int64_t>(row_lengths_.size());
  if (first < 0 || count < 1 || first + count > rows)
    throw std::out_of_range("KVCache::select_rows: rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") outside [0, " + std::to_string(rows) + ")");
  first_row_ = first;
  row_count_ = count;
}

int64_t KVCache::row_length(int64_t row) const {
  if (!per_row_) return length_;
  return row_lengths_.at(static_cast<size_t>(row));
}

void KVCache::reset_row(int64_t row) {
  if (!per_row_) throw std::logic_error("KVCache::reset_row: not a per-row cache");
  row_lengths_.at(static_cast<size_t>(row)) = 0;
  row_hidden_ends_.at(static_cast<size_t>(row)) = 0;
}

void KVCache::hide_row_prefix(int64_t row, int64_t end) {
  if (!per_row_) throw std::logic_error("KVCache::hide_row_prefix: not a per-row cache");
  const int64_t length = row_lengths_.at(static_cast<size_t>(row));
  if (end < 0 || end > length)
    throw std::out_of_range("KVCache::hide_row_prefix: " + std::to_string(end) + " columns of a row of " +
                            std::to_string(length));
  row_hidden_ends_[static_cast<size_t>(row)] = end;
}

torch::Tensor KVCache::new_columns(int64_t time, torch::Device device) const {
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  if (fixed_) return (next_column_ + torch::arange(time, int64.device(device))).view({1, time});  // no host value
  if (!per_row_) return torch::arange(length_, length_ + time, int64.device(device)).view({1, time});
  auto lengths = torch::tensor(std::vector<int64_t>(row_lengths_.begin() + first_row_,
                                                    row_lengths_.begin() + first_row_ + row_count_), int64);
  return (lengths.view({row_count_, 1}) + torch::arange(time, int64).view({1, time})).to(device);  // [B, T]
}

void KVCache::count_replayed_columns(int64_t new_columns) {
  if (!fixed_) throw std::logic_error("KVCache::count_replayed_columns: only a fixed cache is replayed");
  if (length_ + new_columns > capacity_)
    throw std::out_of_range("KV cache full: " + std::to_string(length_) + " + " + std::to_string(new_columns) +
                            " replayed columns exceed capacity " + std::to_string(capacity_));
  length_ += new_columns;
}

int64_t KVCache::write_column(int64_t batch_row) const {
  if (!per_row_) return length_;
  for (int64_t row : taking_part_)
    if (row == batch_row) return row_lengths_[static_cast<size_t>(first_row_ + row)];
  return -1;
}

void KVCache::advance(int64_t new_columns) {
  if (!per_row_) {
    length_ += new_columns;
    if (fixed_) next_column_.add_(new_columns);
    return;
  }
  for (int64_t row : taking_part_) row_lengths_[static_cast<size_t>(first_row_ + row)] += new_columns;
  taking_part_.clear();
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
  if (per_row_) {
    const bool needs_grad = torch::GradMode::is_enabled() && (k.requires_grad() || v.requires_grad());
    if (keys_[index].device().is_cpu() && !needs_grad) {
      // On the CPU each row taking part copies its [G, T, Dh] block into (its cache row, its first
      // column): G runs of T * Dh contiguous values. (index_put_ costs ~20 us a call here, twice per
      // layer per step, more than the rest of a one-row decode step's attention.)
      const auto write = [&](torch::Tensor& cache, const torch::Tensor& x) {
        const auto source = x.to(cache.scalar_type()).contiguous();  // [B, G, T, Dh]
        const int64_t groups = source.size(1), head_dim = source.size(3);
        const auto bytes = static_cast<size_t>(new_columns * head_dim) * source.element_size();
        const auto* from = static_cast<const char*>(source.data_ptr());
        auto* to = static_cast<char*>(cache.data_ptr());
        for (size_t i = 0; i < taking_part_.size(); ++i) {
          const int64_t row = first_row_ + taking_part_[i], column = row_lengths_[static_cast<size_t>(row)];
          for (int64_t g = 0; g < groups; ++g)
            std::memcpy(to + (((row * groups + g) * capacity_ + column) * head_dim) * cache.element_size(),
                        from + ((taking_part_[i] * groups + g) * new_columns * head_dim) * source.element_size(), bytes);
        }
      };
      write(keys_[index], k);
      write(values_[index], v);
    } else {
      // The rows taking part write [B, G, T, Dh] -> [P, T, G, Dh] at (their cache row, each their
      // columns); the index tensors are built once per forward, at its first layer.
      if (!write_rows_.defined()) {
        const auto device = keys_[index].device();
        const auto participants = static_cast<int64_t>(taking_part_.size());
        std::vector<int64_t> write_rows, write_columns;
        for (int64_t row : taking_part_) {
          write_rows.push_back(first_row_ + row);
          const int64_t length = row_lengths_[static_cast<size_t>(first_row_ + row)];
          for (int64_t column = 0; column < new_columns; ++column) write_columns.push_back(length + column);
        }
        taking_part_index_ = torch::tensor(taking_part_, torch::kInt64).to(device);                           // [P]
        write_rows_ = torch::tensor(write_rows, torch::kInt64).view({participants, 1}).to(device);            // [P, 1]
        write_columns_ = torch::tensor(write_columns, torch::kInt64).view({participants, new_columns}).to(device);  // [P, T]
      }
      const auto rows_taking_part = [&](const torch::Tensor& x) {
        const auto all = static_cast<int64_t>(taking_part_.size()) == x.size(0);
        return (all ? x : x.index_select(0, taking_part_index_)).permute({0, 2, 1, 3});
      };
      using torch::indexing::Slice;
      keys_[index].index_put_({write_rows_, Slice(), write_columns_}, rows_taking_part(k));
      values_[index].index_put_({write_rows_, Slice(), write_columns_}, rows_taking_part(v));
    }
    return {keys_[index].narrow(0, first_row_, row_count_).narrow(2, 0, visible_columns_),
            values_[index].narrow(0, first_row_, row_count_).narrow(2, 0, visible_columns_)};
  }
  if (preallocated_) {
    if (length_ + new_columns > capacity_)
      throw std::out_of_range("KV cache full: " + std::to_string(length_) + " + " + std::to_string(new_columns) +
                              " columns exceed capacity " + std::to_string(capacity_));
    if (fixed_) {  // at the columns append_key_mask put on the device; every column returned
      keys_[index].index_copy_(2, write_index_, k.to(keys_[index].scalar_type()));
      values_[index].index_copy_(2, write_index_, v.to(values_[index].scalar_type()));
      return {keys_[index], values_[index]};
    }
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
  if (per_row_) {
    if (new_mask.size(0) != row_count_)
      throw std::invalid_argument("KVCache: a forward of " + std::to_string(new_mask.size(0)) + " rows on " +
                                  std::to_string(row_count_) + " selected cache rows");
    const auto mask = new_mask.to(torch::kBool).cpu();
    const auto all_real = mask.all(1), any_real = mask.any(1);  // [B] bool
    const auto all_real_rows = all_real.accessor<bool, 1>(), any_real_rows = any_real.accessor<bool, 1>();
    taking_part_.clear();
    std::vector<int64_t> lengths;
    visible_columns_ = 0;
    for (int64_t row = 0; row < row_count_; ++row) {
      const int64_t length = row_lengths_[static_cast<size_t>(first_row_ + row)];
      lengths.push_back(length);
      if (!any_real_rows[row]) continue;
      if (!all_real_rows[row])
        throw std::invalid_argument("KVCache: row " + std::to_string(first_row_ + row) +
                                    " of a per-row cache has padding among its new columns (all or none)");
      if (length + new_columns > capacity_)
        throw std::out_of_range("KV cache row " + std::to_string(first_row_ + row) + " full: " + std::to_string(length) +
                                " + " + std::to_string(new_columns) + " columns exceed capacity " + std::to_string(capacity_));
      taking_part_.push_back(row);
      visible_columns_ = std::max(visible_columns_, length + new_columns);
    }
    if (taking_part_.empty()) throw std::invalid_argument("KVCache: no row takes part in this forward");
    write_rows_ = write_columns_ = taking_part_index_ = torch::Tensor();  // built by append when it needs them
    const auto device = keys_.front().device();
    // Each row sees its own columns: those written before and (taking part) the new ones.
    auto visible = torch::tensor(lengths, torch::kInt64).view({row_count_, 1}) + all_real.to(torch::kInt64).view({row_count_, 1}) * new_columns;
    const std::vector<int64_t> hidden_ends(row_hidden_ends_.begin() + first_row_, row_hidden_ends_.begin() + first_row_ + row_count_);
    auto columns = torch::arange(visible_columns_, torch::kInt64).view({1, visible_columns_});
    auto seen = (columns < visible).logical_and(columns >= torch::tensor(hidden_ends, torch::kInt64).view({row_count_, 1}));
    return seen.to(device);  // [B, S]
  }
  if (preallocated_) {
    if (length_ + new_columns > capacity_)
      throw std::out_of_range("KV cache full: cannot add " + std::to_string(new_columns) + " columns");
    if (fixed_) {  // every column, the new ones written at the device-held position
      write_index_ = next_column_ + torch::arange(new_columns, next_column_.options());  // [T]
      key_mask_.index_copy_(1, write_index_, new_mask.to(torch::kBool));
      return key_mask_;
    }
    key_mask_.narrow(1, length_, new_columns).copy_(new_mask);
    return key_mask_.narrow(1, 0, length_ + new_columns);
  }
  // The growing cache keeps exactly `length_` columns of mask; drop any rewound tail first.
  key_mask_ = key_mask_.defined() ? torch::cat({key_mask_.narrow(1, 0, length_), new_mask.to(torch::kBool)}, 1)
                                  : new_mask.to(torch::kBool);
  return key_mask_;
}

void KVCache::hide_prefix(const torch::Tensor& rows, int64_t end) {
  if (per_row_) throw std::logic_error("KVCache::hide_prefix: not for a per-row cache (hide_row_prefix)");
  if (end < 0 || end > length_)
    throw std::out_of_range("KVCache::hide_prefix: " + std::to_string(end) + " columns of " + std::to_string(length_) +
                            " written");
  if (!key_mask_.defined() || rows.numel() != key_mask_.size(0))
    throw std::invalid_argument("KVCache::hide_prefix: needs one flag per cache row after a forward");
  if (fixed_) {  // in place: a replayed graph reads this very tensor
    key_mask_.narrow(1, 0, end).masked_fill_(rows.to(key_mask_.device()).to(torch::kBool).view({-1, 1}), false);
    return;
  }
  // Out of place: a mask returned earlier stays what that forward saw.
  auto hidden = key_mask_.clone();
  hidden.narrow(1, 0, end).masked_fill_(rows.to(hidden.device()).to(torch::kBool).view({-1, 1}), false);
  key_mask_ = hidden;
}

void KVCache::truncate(int64_t length) {
  if (per_row_) throw std::logic_error("KVCache::truncate: not for a per-row cache");
  if (length < 0 || length > length_) throw std::out_of_range("KVCache::truncate beyond its length");
  if (!preallocated_) {
    for (auto& k : keys_)
      if (k.defined()) k = k.narrow(2, 0, length);
    for (auto& v : values_)
      if (v.defined()) v = v.narrow(2, 0, length);
    if (key_mask_.defined()) key_mask_ = key_mask_.narrow(1, 0, length);
  }
  length_ = length;
  if (fixed_) next_column_.fill_(length);
}

void KVCache::repeat_row(int64_t rows) {
  if (!preallocated_ || fixed_ || per_row_) throw std::logic_error("KVCache::repeat_row: only for a preallocated cache");
  if (rows < 1) throw std::invalid_argument("KVCache::repeat_row: rows must be positive");
  if (key_mask_.size(0) != 1) throw std::logic_error("KVCache::repeat_row: the cache has more than one row");
  const auto repeated = [rows](const torch::Tensor& t) {
    auto sizes = t.sizes().vec();
    sizes[0] = rows;
    return t.expand(sizes).contiguous();  // [1, ...] -> [rows, ...]
  };
  for (auto& k : keys_) k = repeated(k);
  for (auto& v : values_) v = repeated(v);
  key_mask_ = repeated(key_mask_);
}

}  // namespace coconut
