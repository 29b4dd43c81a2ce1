"""lm-evaluation-harness itself against `coconut serve`: a multiple-choice task over a local JSONL
file, scored through the server's /v1/completions (echo + logprobs), as a user runs it.

    lm_eval_choices.py BASE_URL TOKENIZER_DIR ITEMS_JSONL OUT_DIR

ITEMS_JSONL holds `coconut eval-lm --choices` items ({"context", "choices", "label"}; the context
ends with the target delimiter, so the task's own delimiter is empty). Waits up to 60 s for the
server, runs lm_eval's local-completions model (the HF tokenizer of TOKENIZER_DIR, token ids sent),
and writes OUT_DIR/result.json: acc, acc_norm, and per document the log-likelihood of each choice.
"""
import glob
import json
import os
import subprocess
import sys
import time
import urllib.request

TASK = """task: coconut_choices
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def main(base_url, tokenizer, items, out_dir):
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "coconut_choices.yaml"), "w") as f:
        f.write(TASK.format(items=os.path.abspath(items)))
    lm_eval = os.path.join(os.path.dirname(sys.executable), "lm_eval")
    model_args = (f"model=coconut,base_url={base_url.rstrip('/')}/completions,tokenizer={tokenizer},"
                  "tokenized_requests=True,num_concurrent=1,max_retries=1")
    environment = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    subprocess.run([lm_eval, "--model", "local-completions", "--model_args", model_args, "--tasks", "coconut_choices",
                    "--include_path", out_dir, "--batch_size", "1", "--log_samples", "--output_path",
                    os.path.join(out_dir, "lm_eval")], check=True, env=environment)
    results = json.load(open(glob.glob(os.path.join(out_dir, "lm_eval", "*", "results_*.json"))[0]))["results"]["coconut_choices"]
    documents = {}
    for line in open(glob.glob(os.path.join(out_dir, "lm_eval", "*", "samples_coconut_choices_*.jsonl"))[0]):
        sample = json.loads(line)
        documents[sample["doc_id"]] = [float(response[0][0]) for response in sample["resps"]]
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"acc": results["acc,none"], "acc_norm": results["acc_norm,none"],
                   "scores": [documents[i] for i in sorted(documents)]}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
