#!/usr/bin/env python3
"""PEFT's logits for SmolLM2-135M-Instruct with an adapter that coconut trained and wrote.

Usage:
    make_smollm2_adapter_reference.py BASE_DIR ADAPTER_DIR OUTPUT_JSON

BASE_DIR is SmolLM2-135M-Instruct as `./run fetch-model smollm2-135m` imports it (.models/
smollm2-135m, float32); ADAPTER_DIR is tests/fixtures/adapters/smollm2-cot-r1: a LoRA rank-1 adapter
on all seven projections plus the four marker rows, written by `coconut train` (four steps of
configs/smollm2/prontoqa_cot.yaml at lr 1e-2, so that its factors are far from zero). transformers
loads the base, peft's PeftModel.from_pretrained the adapter; OUTPUT_JSON gets, for each prompt, its
ids, the logits of 256 sampled vocabulary ids at every position and the top 20 of the last position.
tests/slow_smollm2_test.cpp loads the same pair with coconut and compares, without Python.

Needs torch, transformers, peft (not in the test venv). The committed reference was made with torch
2.15, transformers 5.24 and peft 0.21.2.
"""

import json
import sys

import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM

# Token ids: plain text, and text with the renamed markers (11-14) among it.
PROMPTS = [
    [504, 3575, 282, 4649, 314, 9065, 30, 378, 3575, 282, 1539, 314],
    [11, 13, 13, 12, 504, 2329, 314, 14, 1675, 30, 11, 13, 12],
]


def main(base, adapter, out):
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(model, adapter).eval()
    generator = torch.Generator().manual_seed(20261127)
    sample = torch.randperm(model.config.vocab_size, generator=generator)[:256].sort().values
    sample = torch.cat([torch.tensor([11, 12, 13, 14]), sample]).tolist()
    prompts = []
    with torch.no_grad():
        for ids in PROMPTS:
            logits = model(torch.tensor([ids])).logits[0]  # [T, V]
            top = logits[-1].topk(20)
            prompts.append({"input_ids": ids, "logits_sample": logits[:, sample].tolist(),
                            "last_logits_top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)]})
    with open(out, "w") as f:
        json.dump({"made_by": "tests/reference/make_smollm2_adapter_reference.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "peft": peft.__version__,
                   "sample_ids": sample, "prompts": prompts}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
