#!/usr/bin/env python3
"""A PEFT LoRA adapter (with trainable token rows) over the tiny HF Llama fixture, and PEFT's logits.

Usage:
    make_peft_adapter_reference.py BASE_DIR OUTPUT_DIR

Loads BASE_DIR (tests/fixtures/models/hf-tiny-llama3: tied embeddings, GQA, llama3 RoPE) with
transformers, wraps it with peft's LoraConfig on all seven projections (r 4, alpha 8, factors drawn
at random, not PEFT's zero B, so that every one matters) and trainable_token_indices on four ids
(their rows drawn at random; PEFT ties them to the output head), saves the adapter with
save_pretrained (adapter_config.json, adapter_model.safetensors) and writes OUTPUT_DIR/reference.json:
the input ids (two sequences, the trained tokens among them) and PEFT's float32 logits at every
position. tests/io_peft_adapter_test.cpp loads the base and the adapter with coconut and compares,
without Python at test time.

Needs: torch, transformers, peft, safetensors (not in the test venv, which has no torch). The
committed fixture was made with torch 2.15, transformers 5.24 and peft 0.21.2.
"""

import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM

SEED = 20261127
TOKENS = [5, 6, 7, 8]
IDS = [
    [1, 17, 5, 60, 33, 6, 9, 41, 7, 12, 8, 58, 3, 27],
    [63, 8, 4, 30, 11, 52, 5, 37, 15, 29],
]


def main(base, out):
    torch.manual_seed(SEED)
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                        init_lora_weights=False, trainable_token_indices=TOKENS, task_type="CAUSAL_LM")
    model = get_peft_model(model, config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, 0.2)
            elif "trainable_tokens_delta" in name:
                parameter.normal_(0.0, 0.5)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    logits = []
    with torch.no_grad():
        for ids in IDS:
            logits.append(model(torch.tensor([ids])).logits[0].tolist())  # [T, V]
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"made_by": "tests/reference/make_peft_adapter_reference.py", "torch": torch.__version__,
                   "transformers": transformers.__version__, "peft": peft.__version__,
                   "ids": IDS, "logits": logits}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
