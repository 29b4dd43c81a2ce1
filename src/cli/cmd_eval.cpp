// coconut eval: accuracy and cost per question of a reasoning model on a dataset (batched, KV-cached
// greedy decoding, continuous thoughts included).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "data/example.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "model/device.h"
#include "reasoning/layout.h"
#include "reasoning/thought_control.h"
#include "recipes/evaluate_model.h"
#include "util/atomic_file.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct EvalFlags {
  std::string model, adapter, data, mode, out, summary, dtype, device = "cpu", weights = "auto", drop_layers, depth, cascade, halting;
  std::string thought_control = "none", thought_calibration;
  uint64_t control_seed = 0;
  double cascade_flops = 0;
  std::vector<double> cascade_risk;  // epsilon[, delta]
  int64_t latents = -1, stage = -1, pause_tokens = -1, batch_size = 16, max_new_tokens = 128, limit = 0;
  double exit_threshold = 0, budget = 0, router_threshold = 0.5;
  int64_t exit_min_layers = 1, decode_thoughts = 0, thought_top = 0, halting_peek = 0;
  bool force = false, bandwidth_bound = false;
};

int run_eval(const EvalFlags& flags) {
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.force);
  check_output_path(flags.summary, OutputKind::kFile, "--summary", flags.force);
  auto examples = load_dataset(flags.data);
  if (flags.limit > 0 && static_cast<size_t>(flags.limit) < examples.size()) examples.resize(static_cast<size_t>(flags.limit));
  ModelEvalOptions options;
  options.mode = flags.mode;
  options.latents = flags.latents;
  options.stage = flags.stage;
  options.pause_tokens = flags.pause_tokens;
  options.batch_size = flags.batch_size;
  options.max_new_tokens = flags.max_new_tokens;
  options.dtype = parse_optional_dtype(flags.dtype);
  const std::string weights = resolve_weights(flags.weights, flags.model, !flags.adapter.empty(), parse_device(flags.device).is_cpu());
  options.weights = weight_format_from_name(weights);
  const LlamaConfig config = load_config(flags.model + "/config.json");
  options.drop_layers = layers_to_remove(flags.drop_layers, flags.depth, config.num_hidden_layers);
  if (!flags.cascade.empty() && (!flags.drop_layers.empty() || !flags.depth.empty()))
    throw std::invalid_argument("give --cascade or a fixed depth (--depth / --drop-layers), not both");
  if (!flags.cascade.empty()) options.cascade = parse_depth_cascade(flags.cascade);
  if (flags.depth == "full") options.cascade = DepthCascade{};  // every layer, whatever coconut.json says
  if (!flags.halting.empty()) {
    if (!flags.cascade.empty() || flags.cascade_flops > 0 || !flags.cascade_risk.empty())
      throw std::invalid_argument("give --halting or a depth cascade (--cascade, --cascade-flops, --cascade-risk), not both");
    if (flags.budget > 0 || flags.exit_threshold > 0)
      throw std::invalid_argument("--halting runs every layer it is given: not with --budget or --exit-threshold");
    options.halting = parse_thought_halting(flags.halting);
    options.halting.peek_tokens = flags.halting_peek;
  } else if (flags.halting_peek > 0) {
    throw std::invalid_argument("--halting-peek needs --halting");
  }
  options.device = parse_device(flags.device);
  options.depth = {flags.exit_threshold, flags.exit_min_layers, flags.router_threshold};
  options.decode_thoughts = flags.decode_thoughts;
  options.thought_top = flags.thought_top;
  options.adapter = flags.adapter;
  options.thought_control = thought_control_from_name(flags.thought_control);
  options.control_seed = flags.control_seed;
  if (!flags.thought_calibration.empty()) {
    if (options.thought_control != ThoughtControl::kMean)
      throw std::invalid_argument("--thought-calibration gives the mean thoughts: --thought-control mean only");
    options.control_calibration = load_dataset(flags.thought_calibration);
  }
  const bool routed = config.depth_router;
  if (routed && flags.exit_threshold > 0)
    throw std::invalid_argument(flags.model + ": the model has a depth router; --exit-threshold is for models without one");
  if (flags.budget > 0 || flags.exit_threshold > 0) {  // layers per position: no cascade beside them
    if (!flags.cascade.empty() || flags.cascade_flops > 0 || !flags.cascade_risk.empty())
      throw std::invalid_argument("--cascade is a depth per question: not with --budget or --exit-threshold");
    options.cascade = DepthCascade{};
  }
  if (flags.budget > 0 && routed) {
    options.depth.router_threshold = router_threshold_for_budget(flags.model, examples, options, flags.budget);
    std::fprintf(stderr, "budget %.3g layers per position: router threshold %.5g\n", flags.budget, options.depth.router_threshold);
  } else if (flags.budget > 0) {
    options.depth.exit_threshold = exit_threshold_for_budget(flags.model, examples, options, flags.budget);
    std::fprintf(stderr, "budget %.3g layers per position: exit threshold %.5g\n", flags.budget, options.depth.exit_threshold);
  }
  if (flags.cascade_flops > 0 && !flags.cascade_risk.empty()) throw std::invalid_argument("give --cascade-flops or --cascade-risk, not both");
  const auto to_stderr = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::optional<CascadeCalibrationReport> calibration;  // --cascade-flops / --cascade-risk: what they chose
  if (flags.cascade_flops > 0 || !flags.cascade_risk.empty()) {
    const DepthCascade cascade = cascade_for(load_reasoning_settings(folder_with(flags.model, flags.adapter, "coconut.json")), options);
    options.cascade = cascade;
    calibration.emplace();
    if (flags.cascade_flops > 0) {
      options.cascade->confidence =
          cascade_confidence_for_flops(flags.model, examples, options, cascade, flags.cascade_flops, to_stderr, &*calibration);
    } else {
      if (flags.cascade_risk.size() > 2) throw std::invalid_argument("--cascade-risk: give EPSILON or EPSILON,DELTA");
      const double delta = flags.cascade_risk.size() == 2 ? flags.cascade_risk[1] : 0.1;
      options.cascade->confidence =
          cascade_confidence_for_risk(flags.model, examples, options, cascade, flags.cascade_risk[0], delta, to_stderr, &*calibration);
    }
  }
  const auto summary = evaluate_model_folder(flags.model, examples, options);
  const DepthCascade& cascade = summary.cascade;
  nlohmann::json halting_summary = nullptr;
  if (summary.halting.active())
    halting_summary = {{"thoughts", summary.halting.thoughts}, {"confidence", summary.halting.confidence},
                       {"peek_tokens", summary.halting.peek_tokens}, {"went_on", summary.deepened}};
  nlohmann::json control_summary = nullptr;
  if (summary.thought_control) {
    const ThoughtControlReport& control = *summary.thought_control;
    control_summary = {{"control", thought_control_name(control.control)}, {"seed", control.seed},
                       {"uncontrolled_accuracy", control.uncontrolled_accuracy},
                       {"only_uncontrolled_right", control.test.only_first}, {"only_controlled_right", control.test.only_second},
                       {"mcnemar_p", control.test.p_value}};
    if (control.control == ThoughtControl::kMean)
      control_summary["mean_over"] = {{"data", flags.thought_calibration.empty() ? flags.data : flags.thought_calibration},
                                      {"questions", control.mean_over_questions}};
  }
  nlohmann::json cascade_summary = nullptr;
  if (cascade.active()) {
    cascade_summary = {{"confidence", cascade.confidence}, {"deepened", summary.deepened}};
    if (cascade.layer_sets())
      cascade_summary["removed"] = cascade.removed;
    else
      cascade_summary["depths"] = cascade.depths;
    if (calibration) {  // chosen on these questions (the figures above are measured on them too)
      const auto& c = *calibration;
      cascade_summary["calibration"] = {{"rule", c.rule}, {"questions", c.questions}, {"accuracy", c.accuracy},
                                        {"full_accuracy", c.full_accuracy}, {"flops_fraction", c.flops_fraction}};
      if (c.rule == "flops") cascade_summary["calibration"]["fraction"] = c.target;
      if (c.rule == "risk")
        cascade_summary["calibration"].update({{"epsilon", c.target}, {"delta", c.delta}, {"risk", c.risk}, {"p_value", c.p_value}});
    }
  }

  if (!flags.out.empty()) {
    write_file_atomically(flags.out, [&](std::ostream& out) {
      for (const auto& p : summary.predictions) {
        nlohmann::json record{{"index", p.index}, {"question", p.question}, {"answer", p.expected},
                              {"generated", p.generated_text}, {"predicted", p.predicted}, {"correct", p.correct},
                              {"generated_tokens", p.generated_tokens}, {"latent_thoughts", p.latent_thoughts},
                              {"prompt_tokens", p.prompt_tokens}, {"unknown_tokens", p.unknown_tokens}, {"flops", p.flops}, {"mean_layers", p.mean_layers},
                              {"latency_seconds", p.latency_seconds}};
        if (flags.decode_thoughts > 0) record["thoughts_decoded"] = p.thought_texts;
        if (flags.thought_top > 0) record["thought_top"] = p.thought_tops;  // per thought: [[token, probability], ...]
        if (summary.thought_control) record["uncontrolled_correct"] = static_cast<bool>(summary.thought_control->uncontrolled_correct[p.index]);
        if (!p.cascade.empty()) {
          record["cascade"] = nlohmann::json::array();
          for (const auto& level : p.cascade)
            record["cascade"].push_back({{"layers", level.layers}, {"thoughts", level.thoughts}, {"confidence", level.confidence},
                                         {"generated", level.generated_text}, {"generated_tokens", level.generated_tokens},
                                         {"flops", level.flops}});
        }
        out << record.dump() << "\n";
      }
    });
  }
  nlohmann::json result = {{"model", flags.model}, {"adapter", flags.adapter}, {"data", flags.data}, {"mode", summary.mode},
                           {"questions", summary.questions}, {"accuracy", summary.accuracy},
                           {"mean_generated_tokens", summary.mean_generated_tokens},
                           {"mean_latent_thoughts", summary.mean_latent_thoughts},
                           {"mean_flops", summary.mean_flops},
                           {"mean_latency_seconds", summary.mean_latency_seconds},
                           {"mean_layers", summary.mean_layers}, {"exit_threshold", options.depth.exit_threshold},
                           {"dropped_layers", options.drop_layers},
                           {"depth_cascade", cascade_summary},
                           {"halting", halting_summary},
                           {"thought_control", control_summary},
                           {"router_threshold", routed ? options.depth.router_threshold : 0.0},
                           {"unknown_tokens", summary.unknown_tokens},
                           {"questions_with_unknown_words", summary.questions_with_unknown},
                           {"batch_size", flags.batch_size}, {"seconds", summary.seconds}};
  // Throughput against the weights' bandwidth bound (issue 20): one batched decoding step reads every
  // weight once, so `batch_size` rows decode at most batch_size x bandwidth / weight bytes tokens a
  // second. The measured rate counts every generated token over the whole run, prompts included.
  const double generated = summary.mean_generated_tokens * static_cast<double>(summary.questions);
  result["generated_tokens_per_second"] = summary.seconds > 0 ? generated / summary.seconds : 0.0;
  result["weight_bytes_per_step"] = summary.weight_bytes_per_step;
  result["weights"] = weights;  // dense, or the ggml blocks the projections ran on
  if (flags.bandwidth_bound) {
    const auto device = parse_device(flags.device);
    const double bandwidth = measure_copy_bandwidth(device, device.is_cuda() ? (int64_t{1} << 30) : (int64_t{1} << 28));
    const double bound = static_cast<double>(flags.batch_size) * bandwidth / static_cast<double>(summary.weight_bytes_per_step);
    result["copy_bandwidth_bytes_per_second"] = bandwidth;
    result["bound_tokens_per_second"] = bound;
    result["of_bound"] = result["generated_tokens_per_second"].get<double>() / bound;
  }
  if (summary.unknown_tokens > 0)
    std::fprintf(stderr,
                 "warning: %zu of %zu questions hold words the model's vocabulary does not know (%lld prompt tokens "
                 "encoded as unknown); their answers say little about the model\n",
                 summary.questions_with_unknown, summary.questions, static_cast<long long>(summary.unknown_tokens));
  if (!flags.summary.empty()) write_file_atomically(flags.summary, result.dump(2) + "\n");
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}

const bool registered = register_command({"eval", "accuracy, tokens, thoughts, FLOPs and latency per question",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<EvalFlags>();
  app.add_option("--model", flags->model, "HF model folder (with tokenizer.json; coconut.json gives the defaults)")->required();
  app.add_option("--adapter", flags->adapter, "PEFT LoRA adapter folder merged into --model at load (its tokenizer.json and coconut.json, where present, replace the model's)");
  app.add_option("--data", flags->data, "dataset (.json Coconut, .jsonl GSM8K, .txt icot)")->required();
  app.add_option("--mode", flags->mode, "cot | no_cot | coconut | no_thoughts | pause_as_thought | pause | icot "
                                        "(default: the mode the model was trained in)");
  app.add_option("--latents", flags->latents, "continuous thoughts per question (default: the curriculum rule)")
      ->check(in_range(0, 4096));
  app.add_option("--stage", flags->stage, "curriculum stage whose thought count to use (default: the trained one)")
      ->check(in_range(0, 1000));
  app.add_option("--pause-tokens", flags->pause_tokens, "pause mode: pause tokens after the question")
      ->check(in_range(0, 4096));
  app.add_option("--batch-size", flags->batch_size, "questions decoded together")->capture_default_str()
      ->check(in_range(1, 4096));
  app.add_option("--max-new-tokens", flags->max_new_tokens, "decoding limit per question")->capture_default_str()
      ->check(in_range(1, kMaxTokensFlag));
  app.add_option("--limit", flags->limit, "first N questions only (0 = all)")->capture_default_str()
      ->check(in_range(0, 1e15));
  app.add_option("--exit-threshold", flags->exit_threshold, "early exit: a thought or decoded token stops at the first "
                 "layer (from --exit-min-layers) that moves its state by less than this angular distance (0 = off)")
      ->check(in_range(0, 1));
  app.add_option("--exit-min-layers", flags->exit_min_layers, "early exit: layers every position runs")->capture_default_str()
      ->check(in_range(0, 1e6));
  app.add_option("--router-threshold", flags->router_threshold, "depth router (models trained with one): a thought or "
                 "decoded token runs a layer when its gate probability exceeds this (0 = every layer)")->capture_default_str()
      ->check(in_range(0, 1));
  app.add_option("--budget", flags->budget, "layers per thought / decoded token on average: sets the router threshold of a "
                 "model with a depth router, else the early-exit threshold (calibrated on these questions' compute, not "
                 "their accuracy)")
      ->check(in_range(0, 1e6));
  app.add_option("--decode-thoughts", flags->decode_thoughts, "Coconut: decode each step's thoughts greedily, up to N "
                 "tokens, into --out's thoughts_decoded (what each thought says)")->check(in_range(0, 4096));
  app.add_option("--thought-top", flags->thought_top, "Coconut: each thought's K most likely tokens under the LM head, "
                 "with their probabilities, into --out's thought_top (what each thought holds)")->check(in_range(0, 4096));
  app.add_option("--out", flags->out, "predictions, one JSON object per line");
  app.add_option("--summary", flags->summary, "also write the summary JSON here");
  app.add_flag("--force", flags->force, "replace --out / --summary even when they are not regular files");
  app.add_flag("--bandwidth-bound", flags->bandwidth_bound,
               "also measure the device's copy bandwidth and report tokens/s against batch x bandwidth / weight bytes");
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--weights", flags->weights, kWeightsHelp)->check(CLI::IsMember(kWeightFormats))->capture_default_str();
  app.add_option("--drop-layers", flags->drop_layers,
                 "run a sub-stack: these layers (e.g. 1,5) removed at load, unhealed, for the prompt, the thoughts and the "
                 "answer; mean_flops counts what runs");
  app.add_option("--depth", flags->depth, "K: run the first K layers only (the others removed at load, as --drop-layers); full: all");
  app.add_option("--cascade", flags->cascade, "depth cascade DEPTHS@CONFIDENCE, e.g. 5,8@0.9: every question runs the first "
                 "5 layers (prompt, thoughts, answer); where its answer's lowest token probability is at most 0.9 it goes on "
                 "at 8 from the prompt's state at 5 (default: coconut.json's depth_cascade; --depth full: off). Or over layer "
                 "sets, {REMOVED},...@CONFIDENCE, e.g. {1,3,5,7},{1,5}@0.9: first the model without layers 1, 3, 5 and 7, "
                 "then without 1 and 5 ({} is every layer), each level run whole from the start");
  app.add_option("--halting", flags->halting, "Coconut: thoughts per question, THOUGHTS@CONFIDENCE, e.g. 2,4,6@0.9: after 2 "
                 "thoughts a question peeks at its answer and keeps it where the lowest probability of the tokens peeked "
                 "(--halting-peek) is above 0.9; else it thinks on from its 2nd thought to 4 and peeks again; after 6 it "
                 "answers. Every layer runs (with --depth / --drop-layers, those); mean_flops counts the peeks undone");
  app.add_option("--halting-peek", flags->halting_peek, "halting: the answer tokens a peek reads before deciding (0 = the "
                 "whole answer); a kept answer goes on from them")->capture_default_str()->check(in_range(0, kMaxTokensFlag));
  app.add_option("--cascade-flops", flags->cascade_flops, "calibrate the cascade's confidence on these questions: the highest "
                 "whose mean FLOPs stay within this fraction of the full model's (e.g. 0.7)")->check(in_range(0, 1e6));
  app.add_option("--cascade-risk", flags->cascade_risk, "calibrate the cascade's confidence on these questions with a guarantee: "
                 "EPSILON[,DELTA] (default delta 0.1), the lowest confidence at which the share of questions the full model "
                 "answers right and the cascade does not stays within EPSILON with probability 1 - DELTA (learn then test)")
      ->delimiter(',')
      ->check(CLI::Range(1e-9, 1.0 - 1e-9));
  app.add_option("--thought-control", flags->thought_control, "Coconut: run the questions normally, then with every thought "
                 "replaced, and compare (McNemar): zero (no thoughts, markers kept), noise (Gaussian noise of the thought's "
                 "RMS, seeded), shuffle (another question's thoughts), mean (the mean thought of --thought-calibration), "
                 "token (the embedding of the thought's likeliest token). Every layer runs (with --depth / --drop-layers, those), "
                 "not a trained depth cascade")
      ->check(CLI::IsMember({"none", "zero", "noise", "shuffle", "mean", "token"}))->capture_default_str();
  app.add_option("--control-seed", flags->control_seed, "the noise and the shuffle's seed")->capture_default_str();
  app.add_option("--thought-calibration", flags->thought_calibration, "--thought-control mean: the questions whose "
                 "thoughts are averaged (default: --data)");
  app.add_option("--device", flags->device, "cpu | cuda | auto")->capture_default_str();
  return [flags] { return run_eval(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
