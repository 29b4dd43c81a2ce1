#!/usr/bin/env python3
"""transformers' figures for `coconut eval-lm`: choice scores as lm-evaluation-harness computes them,
and a text's perplexity as HF's perplexity guide computes it.

Usage:
    make_eval_lm_reference.py MODEL_DIR FIXTURE_DIR

MODEL_DIR is SmolLM2-135M-Instruct as `./run fetch-model smollm2-135m` imports it (.models/
smollm2-135m, float32). The inputs are made from the repository's own data and written to
FIXTURE_DIR beside the reference: eval_lm_prosqa.jsonl, the 300 released ProsQA validation
questions as two-choice items (context = the question + "\nAnswer: ", choices = the two statements
its last sentence offers, "Tom is a lempus." / "Tom is a scrompus."), and eval_lm_text.txt, the 500
GSM8K validation questions, one a line. The items are scored as lm-evaluation-harness 0.4's HFLM
scores a loglikelihood request (its _encode_pair: whitespace ending the context moves to the
continuation, context + continuation encoded together with add_special_tokens=False, the
continuation = the tokens after the context's; each (context, continuation) run alone; the score =
the summed log-probabilities of the continuation's tokens); acc and acc_norm as its multiple-choice
process_results (acc_norm divides by len(choice)). The text's first 4,096 tokens (tokenized as a
whole, add_special_tokens=True) are scored in windows of 512 every 256, each window scoring the
tokens the last one did not reach, never its own first (HF's perplexity guide).
tests/slow_smollm2_test.cpp runs coconut on the same inputs and compares, without Python.

Needs torch and transformers (not in the test venv). The committed reference names the versions it
was made with.
"""

import json
import math
import os
import re
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def encode_pair(tokenizer, context, continuation):
    spaces = len(context) - len(context.rstrip())
    if spaces > 0:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids):]


def continuation_log_probability(model, context_ids, continuation_ids):
    ids = context_ids + continuation_ids
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([ids[:-1]])).logits[0].double(), -1)  # [T-1, V]
    first = len(context_ids) - 1
    return sum(float(log_probs[first + i, token]) for i, token in enumerate(continuation_ids))


def make_inputs(fixture_dir):
    """The items and the text, from data/ (paths relative to the repository root)."""
    items_path = os.path.join(fixture_dir, "eval_lm_prosqa.jsonl")
    with open("data/prosqa/valid.json") as f, open(items_path, "w") as out:
        for index, example in enumerate(json.load(f)):
            subject, first, second = re.search(r"Is (\w+) an? (\w+) or (\w+)\?$", example["question"]).groups()
            choices = [f"{subject} is a {first}.", f"{subject} is a {second}."]
            out.write(json.dumps({"id": index, "context": example["question"] + "\nAnswer: ", "choices": choices,
                                  "label": choices.index(example["answer"])}) + "\n")
    text_path = os.path.join(fixture_dir, "eval_lm_text.txt")
    with open("data/gsm8k/valid.json") as f, open(text_path, "w") as out:
        out.write("\n".join(example["question"] for example in json.load(f)) + "\n")
    return items_path, text_path


def main(model_dir, fixture_dir, text_tokens=4096, window=512, stride=256):
    choices_path, text_path = make_inputs(fixture_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    records = []
    with open(choices_path) as f:
        lines = [line for line in f if line.strip()]
    for line in lines:
        item = json.loads(line)
        scores = []
        for choice in item["choices"]:
            context_ids, continuation_ids = encode_pair(tokenizer, item["context"], choice)
            scores.append(continuation_log_probability(model, context_ids, continuation_ids))
        lengths = [float(len(choice)) for choice in item["choices"]]
        pred = max(range(len(scores)), key=lambda c: (scores[c], -c))
        pred_norm = max(range(len(scores)), key=lambda c: (scores[c] / lengths[c], -c))
        records.append({"id": item.get("id"), "scores": scores, "label": item["label"], "pred": pred, "pred_norm": pred_norm})
    count = len(records)
    acc = sum(r["pred"] == r["label"] for r in records) / count
    acc_norm = sum(r["pred_norm"] == r["label"] for r in records) / count

    with open(text_path, encoding="utf-8") as f:
        ids = tokenizer(f.read())["input_ids"][:text_tokens]
    nll, scored, previous_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        first_scored = max(previous_end, begin + 1)
        if first_scored < end:
            with torch.no_grad():
                log_probs = torch.log_softmax(model(torch.tensor([ids[begin:end]])).logits[0].double(), -1)
            for t in range(first_scored, end):
                nll -= float(log_probs[t - 1 - begin, ids[t]])
            scored += end - first_scored
        previous_end = end
        if end == len(ids):
            break

    relative = os.path.relpath(fixture_dir)
    with open(os.path.join(fixture_dir, "eval_lm_reference.json"), "w") as f:
        json.dump({"made_by": "tests/reference/make_eval_lm_reference.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "choices": os.path.join(relative, "eval_lm_prosqa.jsonl"),
                   "items": count, "acc": acc, "acc_norm": acc_norm, "records": records,
                   "text": os.path.join(relative, "eval_lm_text.txt"), "text_tokens": len(ids), "window": window,
                   "stride": stride, "scored_tokens": scored, "nll": nll, "perplexity": math.exp(nll / scored)}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
