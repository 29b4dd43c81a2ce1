// coconut serve: an OpenAI-compatible HTTP server with continuous batching (src/serve/server.h).
#include <iostream>
#include <memory>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "model/threads.h"
#include "serve/server.h"

namespace coconut::cli {
namespace {

const bool registered = register_command({"serve", "serve a model over HTTP (OpenAI-compatible, continuous batching)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto options = std::make_shared<serve::ServeOptions>();
  options->wide_step_threads = -1;  // every core, unless told otherwise (below)
  app.add_option("--model", options->model_dir, "HF model folder (config.json, weights, tokenizer.json, coconut.json)")->required();
  app.add_option("--adapter", options->adapter_dir, "PEFT LoRA adapter folder merged into --model at load (its tokenizer.json and coconut.json, where present, replace the model's)");
  app.add_option("--host", options->host, "address to listen on")->capture_default_str();
  app.add_option("--port", options->port, "port to listen on (0 = any free one)")->capture_default_str()
      ->check(in_range(0, 65535));
  app.add_option("--max-batch", options->max_batch, "requests decoded together (KV-cache slots)")->capture_default_str()
      ->check(in_range(1, 1024));
  app.add_option("--max-queue", options->max_queue, "requests waiting for a slot before 503")->capture_default_str()
      ->check(in_range(0, 100000));
  app.add_option("--context", options->context, "positions per slot (0 = the model's max_position_embeddings)")
      ->capture_default_str()->check(in_range(0, kMaxTokensFlag));
  app.add_option("--max-queued-tokens", options->max_queued_tokens,
                 "positions the queued requests may need in all, prompts and max_tokens counted (0 = max batch x context); "
                 "more: 503")
      ->capture_default_str()->check(in_range(0, 1e12));
  app.add_option("--max-queue-wait", options->max_queue_wait_seconds,
                 "seconds a request may wait for a slot before 503; one the work ahead would keep longer is refused at once")
      ->capture_default_str()->check(in_range(0, 86400));
  app.add_option("--prefill-chunk", options->prefill_chunk, "prompt tokens a request reads per step (0 = all at once)")
      ->capture_default_str()->check(in_range(0, kMaxTokensFlag));
  app.add_option("--max-body-bytes", options->max_body_bytes, "largest request body (413 above)")->capture_default_str()
      ->check(in_range(1, 1 << 30));
  app.add_option("--max-connections", options->max_connections,
                 "open connections at once; more are answered 503 and closed (at most the file limit less 128)")
      ->capture_default_str()->check(in_range(1, 1 << 20));
  app.add_option("--request-timeout", options->read_timeout_seconds,
                 "seconds from a request's first byte to its last (408 and closed after)")
      ->capture_default_str()->check(in_range(1, 3600));
  app.add_option("--first-byte-timeout", options->first_byte_timeout_seconds,
                 "seconds a new or idle keep-alive connection may wait before sending a request (closed after)")
      ->capture_default_str()->check(in_range(0.1, 3600.0));
  app.add_option("--shutdown-grace", options->shutdown_grace_seconds, "seconds in-flight requests get after SIGTERM")
      ->capture_default_str()->check(in_range(0, 86400));
  app.add_option("--wide-step-threads", options->wide_step_threads,
                 "intra-op threads for a pass over at least --wide-step-rows positions, a decoding step of that many "
                 "rows or a prompt chunk that long (default: every core; 0 = the usual count, one core less than "
                 "the machine's, for every pass)")
      ->check(in_range(0, 4096));
  app.add_option("--wide-step-rows", options->wide_step_rows,
                 "positions from which a pass is wide (default automatic: 1 where a decoded token reads at least 32 MB "
                 "of weights, else 8)")
      ->check(in_range(1, 1 << 20));
  app.add_option("--lanes", options->lanes,
                 "KV-cache lanes stepped side by side, one thread each, when two or more hold requests (default "
                 "automatic: every core when the weights fit in the last-level cache, else 1)")
      ->check(in_range(0, 4096));
  app.add_option("--stream-interval-ms", options->stream_interval_ms,
                 "while other requests run, a stream writes its tokens (one event each) at most this often; its first "
                 "token goes at once (0 = every token as it is made)")
      ->capture_default_str()->check(in_range(0, 10000));
  app.add_option("--dtype", options->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--weights", options->weights, kWeightsHelp)->check(CLI::IsMember(kWeightFormats))->capture_default_str();
  app.add_option("--device", options->device, "cpu | cuda | cuda:N")->capture_default_str();
  return [options] {
    configure_threads(/*reserved_cores=*/1);  // one core for the HTTP threads (model/threads.h)
    // Wide steps take every core unless the thread count was given (OMP_NUM_THREADS) or the flag.
    if (options->wide_step_threads < 0) options->wide_step_threads = wide_pass_threads();
    return serve::serve(*options, std::cerr);
  };
}});

}  // namespace
}  // namespace coconut::cli
