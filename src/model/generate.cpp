#include "model/generate.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/cuda_graph.h"

namespace coconut {

double lowest_probability(const std::vector<double>& probabilities, int64_t first) {
  const size_t count = first > 0 ? std::min(probabilities.size(), static_cast<size_t>(first)) : probabilities.size();
  return count == 0 ? 1.0 : *std::min_element(probabilities.begin(), probabilities.begin() + static_cast<std::ptrdiff_t>(count));
}

std::vector<int64_t> sample_next_tokens(const torch::Tensor& logits, const SamplingOptions& options, std::mt19937_64& rng) {
  const int64_t rows = logits.size(0);
  std::vector<int64_t> next(rows);
  if (options.temperature <= 0.0) {
    const auto best = logits.argmax(-1).to(torch::kCPU).contiguous();  // [B]
    std::copy_n(best.data_ptr<int64_t>(), rows, next.begin());
    return next;
  }
  const int64_t vocab = logits.size(1);
  const int64_t keep = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
  // Sorted candidates per row: [B, keep], probabilities in float64 on the host.
  auto [values, indices] = (logits.to(torch::kFloat64) / options.temperature).topk(keep, -1, true, true);
  auto probabilities = torch::softmax(values, -1).to(torch::kCPU).contiguous();
  indices = indices.to(torch::kCPU).contiguous();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t row = 0; row < rows; ++row) {
    const double* p = probabilities[row].data_ptr<double>();
    const int64_t* ids = indices[row].data_ptr<int64_t>();
    // Nucleus: the smallest prefix of the sorted candidates whose mass reaches top_p.
    int64_t count = keep;
    if (options.top_p < 1.0) {
      double mass = 0.0;
      for (int64_t i = 0; i < keep; ++i) {
        mass += p[i];
        if (mass >= options.top_p) {
          count = i + 1;
          break;
        }
      }
    }
    const double total = std::accumulate(p, p + count, 0.0);
    double target = uniform(rng) * total;
    int64_t chosen = count - 1;
    for (int64_t i = 0; i < count; ++i) {
      target -= p[i];
      if (target <= 0.0) {
        chosen = i;
        break;
      }
    }
    next[row] = ids[chosen];
  }
  return next;
}

namespace {

// The prompt pass's input when it continues from prefixes: their residuals left-padded to
// [B, width, D], after their K/V went into the cache's layers below them (the columns the pass
// then writes for the layers above; the pass advances the cache).
torch::Tensor continue_from_prefixes(const std::vector<PromptPrefix>& prefixes, const std::vector<std::vector<int64_t>>& prompts,
                                     int64_t width, int64_t layers, const torch::Tensor& embeddings, KVCache& cache) {
  const auto batch = static_cast<int64_t>(prompts.size());
  if (static_cast<int64_t>(prefixes.size()) != batch)
    throw std::invalid_argument("generate: " + std::to_string(prefixes.size()) + " prompt prefixes for " +
                                std::to_string(batch) + " prompts");
  const int64_t first = prefixes.front().layers;
  if (first < 1 || first >= layers)
    throw std::invalid_argument("generate: a prompt prefix of " + std::to_string(first) + " layers cannot continue to " +
                                std::to_string(layers));
  for (int64_t row = 0; row < batch; ++row) {
    const auto& prefix = prefixes[static_cast<size_t>(row)];
    if (prefix.layers != first || static_cast<int64_t>(prefix.keys.size()) != first ||
        static_cast<int64_t>(prefix.values.size()) != first || prefix.residual.size(0) != static_cast<int64_t>(prompts[row].size()))
      throw std::invalid_argument("generate: prompt prefix " + std::to_string(row) + " does not match its prompt (" +
                                  std::to_string(first) + " layers, " + std::to_string(prompts[row].size()) + " tokens)");
  }
  auto inputs = torch::zeros_like(embeddings);  // [B, width, D]; padding columns stay 0 (masked)
  for (int64_t row = 0; row < batch; ++row) {
    const auto& residual = prefixes[static_cast<size_t>(row)].residual;
    inputs[row].narrow(0, width - residual.size(0), residual.size(0)).copy_(residual);
  }
  for (int64_t layer = 0; layer < first; ++layer) {
    const auto& sample = prefixes.front().keys[static_cast<size_t>(layer)];  // [G, T, Dh]
    auto keys = torch::zeros({batch, sample.size(0), width, sample.size(2)}, sample.options());
    auto values = torch::zeros_like(keys);
    for (int64_t row = 0; row < batch; ++row) {
      const auto& prefix = prefixes[static_cast<size_t>(row)];
      const int64_t length = prefix.residual.size(0);
      keys[row].narrow(1, width - length, length).copy_(prefix.keys[static_cast<size_t>(layer)]);
      values[row].narrow(1, width - length, length).copy_(prefix.values[static_cast<size_t>(layer)]);
    }
    cache.append(layer, keys, values);  // columns [0, width) of the layer; the pass advances the cache
  }
  return inputs;
}

}  // namespace

GenerationResult generate(Llama& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options) {
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  for (const auto& prompt : prompts)
    if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  torch::NoGradGuard no_grad;
  model->eval();
  const auto parameter = model->embed_tokens->weight;
  const auto device = parameter.device();
  const int64_t batch = static_cast<int64_t>(prompts.size());
  size_t longest = 0;
  for (const auto& prompt : prompts) longest = std::max(longest, prompt.size());
  const int64_t width = static_cast<int64_t>(longest);

  // Left padding: [B, width] ids and mask; positions count real tokens from 0.
  auto ids = torch::zeros({batch, width}, torch::kInt64);
  auto mask = torch::zeros({batch, width}, torch::kInt64);
  GenerationResult result;
  result.tokens.resize(batch);
  for (int64_t row = 0; row < batch; ++row) {
    const auto& prompt = prompts[row];
    const int64_t offset = width - static_cast<int64_t>(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) {
      ids[row][offset + static_cast<int64_t>(i)] = prompt[i];
      mask[row][offset + static_cast<int64_t>(i)] = 1;
    }
    result.prefill_tokens += static_cast<int64_t>(prompt.size());
  }
  ids = ids.to(device);
  mask = mask.to(device);
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);  // [B, width]
  const bool padded = !mask.all().item<bool>();

  if (options.latent_thoughts < 0) throw std::invalid_argument("generate: negative latent_thoughts");
  if (options.max_new_tokens < 0) throw std::invalid_argument("generate: negative max_new_tokens");
  const auto after = static_cast<int64_t>(options.after_latents.size());
  // The KV cache holds every position up front: a length past the model's context is refused here
  // rather than allocated (a long enough prompt would ask for terabytes).
  const int64_t positions_needed = width + options.latent_thoughts + after + options.max_new_tokens;
  if (positions_needed > model->config().max_position_embeddings)
    throw std::invalid_argument("generate: the longest prompt (" + std::to_string(width) + " tokens) + " +
                                std::to_string(options.latent_thoughts + after) + " thought positions + max_new_tokens " +
                                std::to_string(options.max_new_tokens) + " need " + std::to_string(positions_needed) +
                                " positions, more than the model's max_position_embeddings " +
                                std::to_string(model->config().max_position_embeddings));
  const auto cache_dtype = attention_dtype(parameter.scalar_type(), device);
  if (options.cuda_graph) {
    if (!device.is_cuda()) throw std::invalid_argument("generate: cuda_graph needs the model on a CUDA device");
    if (!CapturedStep::available()) throw std::invalid_argument("generate: cuda_graph: this build's libtorch has no CUDA");
    if (options.depth.exit_threshold > 0 || (model->config().depth_router && options.depth.router_threshold > 0))
      throw std::invalid_argument("generate: cuda_graph replays every layer: no early exit or depth router");
  }
  const bool fixed = options.fixed_cache || options.cuda_graph;
  const ThoughtHalting& halting = options.halting;
  if (halting.active()) {
    if (halting.thoughts.back() != options.latent_thoughts)
      throw std::invalid_argument("generate: halting's last thought count (" + std::to_string(halting.thoughts.back()) +
                                  ") must be latent_thoughts (" + std::to_string(options.latent_thoughts) + ")");
    for (size_t i = 0; i < halting.thoughts.size(); ++i)
      if (halting.thoughts[i] < 0 || (i > 0 && halting.thoughts[i] <= halting.thoughts[i - 1]))
        throw std::invalid_argument("generate: halting's thought counts must ascend from 0");
    if (halting.peek_tokens < 0) throw std::invalid_argument("generate: negative halting peek_tokens");
    if (fixed || options.latent_bottleneck || options.depth.exit_threshold > 0 ||
        (model->config().depth_router && options.depth.router_threshold > 0))
      throw std::invalid_argument("generate: halting rewinds its peeks: not with the fixed cache, the latent bottleneck, early "
                                  "exit or the depth router");
  }

  KVCache cache = fixed ? KVCache::fixed(model->config(), batch, positions_needed, cache_dtype, device)
                        : KVCache::preallocated(model->config(), batch, positions_needed, cache_dtype, device);
  ForwardOptions forward_options;
  forward_options.depth = DepthPolicy::every_layer();  // the prompt runs every layer, even a one-token prompt
  if (padded) forward_options.attention_mask = mask;
  const int64_t depth = model->config().num_hidden_layers;
  if (options.layers < 0 || options.layers > depth)
    throw std::invalid_argument("generate: layers " + std::to_string(options.layers) + " is not in 0.." + std::to_string(depth));
  const int64_t layers = options.layers > 0 ? options.layers : depth;
  if (layers < depth || !options.prompt_prefixes.empty()) {
    if (options.depth.exit_threshold > 0 || (model->config().depth_router && options.depth.router_threshold > 0))
      throw std::invalid_argument("generate: a prefix of the layers runs every one of them: no early exit or depth router");
    if (fixed) throw std::invalid_argument("generate: a prefix of the layers needs the growing-length cache (no CUDA graph)");
  }
  forward_options.end_layer = layers;
  if (!options.skip_layers.empty()) {
    if (layers < depth || !options.prompt_prefixes.empty() || options.keep_prompt_prefixes || fixed ||
        options.depth.exit_threshold > 0 || (model->config().depth_router && options.depth.router_threshold > 0))
      throw std::invalid_argument("generate: skip_layers runs every other layer: no prefix, prompt prefixes, early exit, router "
                                  "or fixed cache with it");
    for (int64_t layer : options.skip_layers)
      if (layer < 0 || layer >= depth)
        throw std::invalid_argument("generate: skip_layers: no layer " + std::to_string(layer) + " in 0.." + std::to_string(depth - 1));
    if (static_cast<int64_t>(options.skip_layers.size()) >= depth) throw std::invalid_argument("generate: skip_layers: every layer");
    forward_options.skip_layers = options.skip_layers;
  }
  auto inputs = model->embed(ids);  // [B, width, D]
  if (!options.prompt_prefixes.empty()) {
    inputs = continue_from_prefixes(options.prompt_prefixes, prompts, width, layers, inputs, cache);
    forward_options.first_layer = options.prompt_prefixes.front().layers;
  }
  forward_options.return_residuals = options.keep_prompt_prefixes;
  // Only the prompt's last column is read: the last layer runs its queries, output projection and
  // MLP there alone (every column still writes K/V), as llama.cpp's prompt passes do, where it does
  // (cuts_last_layer).
  if (cuts_last_layer(ids.device())) forward_options.first_output_column = width - 1;
  const auto prompt_pass = model->forward(inputs, positions, &cache, forward_options);
  forward_options.first_output_column = 0;
  auto hidden = prompt_pass.hidden;  // [B, 1, D] (the CPU) or [B, width, D]
  if (options.keep_prompt_prefixes) {
    std::vector<std::pair<torch::Tensor, torch::Tensor>> columns;  // per layer: K and V [B, G, width, Dh]
    for (int64_t layer = 0; layer < layers; ++layer) columns.push_back(cache.columns(layer));
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t length = static_cast<int64_t>(prompts[row].size()), offset = width - length;
      PromptPrefix prefix;
      prefix.layers = layers;
      prefix.residual = prompt_pass.residuals.back()[row].narrow(0, offset, length).clone();  // [T, D]
      for (const auto& [keys, values] : columns) {
        prefix.keys.push_back(keys[row].narrow(1, offset, length).clone());
        prefix.values.push_back(values[row].narrow(1, offset, length).clone());
      }
      result.prompt_prefixes.push_back(std::move(prefix));
    }
  }
  forward_options.return_residuals = false;
  forward_options.first_layer = 0;
  // Early exit and the router apply to the one-position passes only.
  forward_options.depth = options.depth;
  auto last_hidden = hidden.narrow(1, hidden.size(1) - 1, 1);                                 // [B, 1, D]
  torch::Tensor next_positions = positions.select(1, width - 1) + 1;                           // [B]
  result.exits.resize(batch);
  const auto record_exits = [&](const ForwardResult& pass, const std::vector<bool>& active) {
    if (!pass.layers_skipped.defined()) return;
    const auto skipped = pass.layers_skipped.cpu();   // [B, L] bool
    const auto context = (next_positions + 1).cpu();  // this position and every earlier real one
    const auto skipped_rows = skipped.accessor<bool, 2>();
    for (int64_t row = 0; row < batch; ++row) {
      if (!active[row]) continue;
      AdaptivePass record;
      record.context = context[row].item<int64_t>();
      for (int64_t layer = 0; layer < skipped.size(1); ++layer)
        if (skipped_rows[row][layer]) record.skipped_layers.push_back(layer);
      record.layers_run = skipped.size(1) - static_cast<int64_t>(record.skipped_layers.size());
      result.exits[row].push_back(std::move(record));
    }
  };
  if (padded) forward_options.attention_mask = torch::ones({batch, 1}, mask.options());
  // The answer: the tokens after the thoughts as one forward, then one token at a time. pick()
  // chooses every row's next token from `logits` and records it for the rows still answering;
  // feed() runs the picked tokens through the model for the next logits.
  std::mt19937_64 rng(options.sampling.seed);
  std::vector<bool> finished(batch, false);
  std::vector<int64_t> next;
  int64_t picked = 0;  // tokens picked in the current answer
  std::vector<std::vector<int64_t>> answer(batch);
  std::vector<std::vector<double>> answer_probabilities(batch);
  torch::Tensor logits;
  const auto is_stop = [&](int64_t token) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end();
  };
  const bool probabilities = options.record_probabilities || halting.active();
  const auto all_finished = [&] { return std::all_of(finished.begin(), finished.end(), [](bool f) { return f; }); };
  const auto start_answer = [&](const std::vector<bool>& answering) {
    for (int64_t row = 0; row < batch; ++row) {
      finished[row] = !answering[row];
      answer[row].clear();
      answer_probabilities[row].clear();
    }
    picked = 0;
    if (options.latent_bottleneck && options.latent_thoughts > 0)
      cache.hide_prefix(torch::ones({batch}, torch::kBool), width - 1);
    if (after > 0) {  // several positions: every layer runs
      auto after_ids = torch::tensor(options.after_latents, torch::kInt64).to(device).view({1, after}).expand({batch, after});
      auto after_positions = next_positions.view({batch, 1}) + torch::arange(after, next_positions.options()).view({1, after});
      if (padded) forward_options.attention_mask = torch::ones({batch, after}, mask.options());
      ForwardOptions every_layer = forward_options;
      every_layer.depth = DepthPolicy::every_layer();
      hidden = model->forward(model->embed(after_ids), after_positions, &cache, every_layer).hidden;  // [B, after, D]
      last_hidden = hidden.narrow(1, after - 1, 1);
      next_positions = next_positions + after;
    }
    logits = model->logits(last_hidden.select(1, 0));  // [B, V]
  };
  const auto pick = [&] {
    next = sample_next_tokens(logits, options.sampling, rng);
    torch::Tensor chosen;  // [B] float64: each row's token probability
    if (probabilities) {
      const auto rows_picked = torch::tensor(next, torch::kInt64).to(logits.device()).view({batch, 1});
      chosen = torch::softmax(logits.to(torch::kFloat64), -1).gather(1, rows_picked).view({batch}).cpu();
    }
    for (int64_t row = 0; row < batch; ++row) {
      if (finished[row]) continue;
      answer[row].push_back(next[row]);
      if (chosen.defined()) answer_probabilities[row].push_back(chosen[row].item<double>());
      if (is_stop(next[row])) finished[row] = true;
    }
    ++picked;
  };
  // CUDA graph: the decode step reads its token ids and positions from these tensors, refilled in
  // place (ids) or advanced inside the graph (positions), and leaves its logits in graph_logits.
  std::unique_ptr<CapturedStep> graph;
  torch::Tensor graph_ids, graph_positions, graph_logits;
  const auto feed = [&] {
    if (options.cuda_graph) {
      const auto ids_now = torch::tensor(next, torch::kInt64).view({batch, 1});  // [B, 1] host
      if (!graph) {
        graph_ids = ids_now.to(device);
        graph_positions = next_positions.view({batch, 1}).clone();  // [B, 1]
        if (padded) forward_options.attention_mask = torch::ones({batch, 1}, mask.options());  // one tensor for every replay
        graph = std::make_unique<CapturedStep>(
            [&] { model->logits(model->forward(model->embed(graph_ids), graph_positions, nullptr, forward_options).hidden); },
            [&] {
              const auto pass = model->forward(model->embed(graph_ids), graph_positions, &cache, forward_options);
              graph_logits = model->logits(pass.hidden.select(1, 0));  // [B, V]
              graph_positions.add_(1);
            });
        // The capture ran the step's host side (the cache counted its column), not its kernels.
      } else {
        graph_ids.copy_(ids_now);
        cache.count_replayed_columns(1);
      }
      graph->replay();
      logits = graph_logits;
    } else {
      auto step_ids = torch::tensor(next, torch::kInt64).to(device).view({batch, 1});  // [B, 1]
      if (padded) forward_options.attention_mask = torch::ones({batch, 1}, mask.options());
      const auto pass = model->forward(model->embed(step_ids), next_positions.view({batch, 1}), &cache, forward_options);
      std::vector<bool> active(batch);
      for (int64_t row = 0; row < batch; ++row) active[row] = !finished[row];
      record_exits(pass, active);
      logits = model->logits(pass.hidden.select(1, 0));
    }
    next_positions = next_positions + 1;
    ++result.decode_steps;
  };
  // Picks up to `limit` tokens of the current answer in all (the last one picked is not fed back).
  const auto answer_up_to = [&](int64_t limit) {
    if (picked == 0 && limit > 0) pick();
    while (!all_finished() && picked < limit) {
      feed();
      pick();
    }
  };

  // Continuous thoughts: the last hidden state is the next input embedding (LlamaImpl::thought_input).
  // Halting: at each count but the last, the rows still thinking peek at their answer.
  std::vector<bool> thinking(batch, true);
  if (halting.active()) {
    result.thoughts_taken.assign(batch, options.latent_thoughts);
    result.undone_peeks.resize(batch);
  }
  if (options.record_probabilities) result.token_probabilities.assign(batch, {});
  const auto keep_answer = [&](int64_t row) {
    result.tokens[row] = answer[row];
    if (options.record_probabilities) result.token_probabilities[row] = answer_probabilities[row];
  };
  size_t checkpoint = 0;  // the next count to peek at
  for (int64_t i = 0;; ++i) {
    const bool peek = halting.active() && checkpoint + 1 < halting.thoughts.size() && halting.thoughts[checkpoint] == i;
    if (peek) {
      ++checkpoint;
      const int64_t columns = cache.length();
      const auto thought_hidden = last_hidden;
      const auto thought_positions = next_positions;
      start_answer(thinking);
      answer_up_to(halting.peek_tokens > 0 ? std::min(halting.peek_tokens, options.max_new_tokens) : options.max_new_tokens);
      std::vector<int64_t> halted;
      for (int64_t row = 0; row < batch; ++row) {
        if (!thinking[row]) continue;
        if (lowest_probability(answer_probabilities[row]) > halting.confidence) {
          thinking[row] = false;
          result.thoughts_taken[row] = i;
          halted.push_back(row);
        } else {
          result.undone_peeks[row].push_back({i, answer[row], answer_probabilities[row]});
          finished[row] = true;
        }
      }
      answer_up_to(options.max_new_tokens);  // the halted rows' answers, to their end
      for (int64_t row : halted) keep_answer(row);
      cache.truncate(columns);  // the rows thinking on continue from their thoughts
      last_hidden = thought_hidden;
      next_positions = thought_positions;
      if (padded) forward_options.attention_mask = torch::ones({batch, 1}, mask.options());
    }
    if (i == options.latent_thoughts || std::count(thinking.begin(), thinking.end(), true) == 0) break;
    auto thought = model->thought_input(last_hidden);  // [B, 1, D]
    if (options.replace_thought) {
      thought = options.replace_thought(i, last_hidden, thought).to(last_hidden.options());
      TORCH_CHECK(thought.sizes() == last_hidden.sizes(), "generate: replace_thought must return [B, 1, D] ", last_hidden.sizes(),
                  ", got ", thought.sizes());
    }
    const auto pass = model->forward(thought, next_positions.view({batch, 1}), &cache, forward_options);
    record_exits(pass, std::vector<bool>(batch, true));
    last_hidden = pass.hidden;
    next_positions = next_positions + 1;
    ++result.latent_steps;
  }
  if (std::count(thinking.begin(), thinking.end(), true) > 0) {
    start_answer(thinking);
    answer_up_to(options.max_new_tokens);
    for (int64_t row = 0; row < batch; ++row)
      if (thinking[row]) keep_answer(row);
  }
  result.prefill_tokens += batch * after;
  return result;
}

}  // namespace coconut
