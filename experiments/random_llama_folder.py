#!/usr/bin/env python3
"""A Llama HF folder of random weights (normal, sd 0.02; norms 1) in float32, with SmolLM2's tokenizer,
for measuring kernels on shapes other than SmolLM2's: export-gguf it, quantize it with llama-quantize,
import it again (docs/real-models.md, "A larger file of k-quants"). Needs numpy only.

    python3 experiments/random_llama_folder.py OUT [--hidden 2048] [--intermediate 8192] [--layers 4]
        [--heads 32] [--kv-heads 8] [--seed 0] [--tokenizer .models/smollm2-135m]
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=".models/smollm2-135m", help="folder whose tokenizer files and config are copied")
    args = parser.parse_args()
    config = json.load(open(os.path.join(args.tokenizer, "config.json")))
    vocab, hidden, head_dim = config["vocab_size"], args.hidden, args.hidden // args.heads
    rng = np.random.default_rng(args.seed)
    tensors = {}

    def add(name, shape, ones=False):
        tensors[name] = np.ones(shape, np.float32) if ones else rng.standard_normal(shape, dtype=np.float32) * 0.02

    add("model.embed_tokens.weight", (vocab, hidden))
    add("model.norm.weight", (hidden,), ones=True)
    for layer in range(args.layers):
        p = f"model.layers.{layer}."
        add(p + "input_layernorm.weight", (hidden,), ones=True)
        add(p + "post_attention_layernorm.weight", (hidden,), ones=True)
        add(p + "self_attn.q_proj.weight", (args.heads * head_dim, hidden))
        add(p + "self_attn.k_proj.weight", (args.kv_heads * head_dim, hidden))
        add(p + "self_attn.v_proj.weight", (args.kv_heads * head_dim, hidden))
        add(p + "self_attn.o_proj.weight", (hidden, args.heads * head_dim))
        add(p + "mlp.gate_proj.weight", (args.intermediate, hidden))
        add(p + "mlp.up_proj.weight", (args.intermediate, hidden))
        add(p + "mlp.down_proj.weight", (hidden, args.intermediate))
    header, offset = {}, 0
    for name in sorted(tensors):
        size = tensors[name].nbytes
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as file:
        file.write(struct.pack("<Q", len(text)))
        file.write(text)
        for name in sorted(tensors):
            file.write(tensors[name].tobytes())
    config.update({"hidden_size": hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
                   "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "tie_word_embeddings": True,
                   "torch_dtype": "float32"})
    config.pop("head_dim", None)
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(args.tokenizer, name)):
            shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    print(f"wrote {args.out}: {args.layers} layers, width {hidden}, MLP {args.intermediate}, vocabulary {vocab}")


if __name__ == "__main__":
    main()
