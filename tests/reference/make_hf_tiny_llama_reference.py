#!/usr/bin/env python3
"""HF transformers' logits for a tiny random Llama with llama3 RoPE scaling, GQA and tied embeddings.

Usage:
    make_hf_tiny_llama_reference.py OUTPUT_DIR

Builds transformers' own LlamaForCausalLM from the config below (seeded random weights; norm gains
drawn in [0.5, 1.5] so that they matter), saves it with save_pretrained (config.json and
model.safetensors, float32) and writes OUTPUT_DIR/reference.json: the input ids (two sequences)
and transformers' float32 logits for every position, plus the versions that made them. The
model is small enough to commit (about 100 KB) and tests/io_hf_reference_test.cpp compares
coconut's forward pass of the saved folder with these logits, without Python at test time.

Needs: torch, transformers, safetensors (not in the test venv, which has no torch). Runs on CPU in
seconds. The committed fixture was made with torch 2.15 and transformers 5.24.
"""

import json
import os
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 20261127
IDS = [
    [1, 17, 5, 60, 33, 2, 9, 41, 41, 12, 7, 58, 3, 27, 50, 19, 0, 44, 23, 8],
    [63, 4, 4, 30, 11, 52, 6, 37, 15, 29, 1, 48, 20, 14],
]


def main(out):
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: 2 query heads per KV head
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        # A small original context so that all three llama3 bands occur at head_dim 8 (wavelengths
        # 6.3, 30, 140, 660 against the band edges 32 / 4 = 8 and 32 / 1 = 32).
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "head not tied"
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    generation_config = os.path.join(out, "generation_config.json")  # not read by the test
    if os.path.exists(generation_config):
        os.remove(generation_config)
    logits = []
    with torch.no_grad():
        for ids in IDS:
            logits.append(model(torch.tensor([ids])).logits[0].tolist())  # [T, V]
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"made_by": "tests/reference/make_hf_tiny_llama_reference.py",
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "ids": IDS, "logits": logits}, f)


if __name__ == "__main__":
    main(sys.argv[1])
