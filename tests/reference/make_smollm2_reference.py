#!/usr/bin/env python3
"""Reference outputs of HF transformers for SmolLM2-135M-Instruct loaded from a GGUF.

Usage:
    make_smollm2_reference.py GGUF_PATH OUTPUT_JSON

transformers dequantizes every GGUF tensor to float32 (and un-permutes the
attn_q / attn_k rows that llama.cpp's converter permuted), so these outputs are
what a float32 importer of the same GGUF should reproduce.

Writes OUTPUT_JSON and, beside it, france_last_logits.f32: the full
last-position logits (vocab_size raw little-endian float32) of the first prompt.

Needs: torch, transformers, accelerate (required by transformers for GGUF),
gguf, numpy. Runs on CPU in about a minute.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 4, 5,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village",
]
TOP_K = 20
N_SAMPLE_RANDOM = 48
SAMPLE_SEED = 20240607
N_GREEDY = 24
# Tensors whose dequantized values are summarised in "weight_stats".
STAT_TENSORS = [
    "token_embd.weight",
    "output_norm.weight",
    "blk.0.attn_norm.weight",
    "blk.0.attn_q.weight",
    "blk.0.attn_k.weight",
    "blk.0.attn_v.weight",
    "blk.0.attn_output.weight",
    "blk.0.ffn_norm.weight",
    "blk.0.ffn_gate.weight",
    "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight",
    "blk.29.attn_q.weight",
    "blk.29.ffn_down.weight",
]


def r6(x):
    """Round to 6 significant digits (as a JSON-friendly Python float)."""
    return float(f"{float(x):.6g}")


def r6_list(a):
    return [r6(v) for v in np.asarray(a, dtype=np.float64).ravel()]


def hf_name(gguf_name):
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, rest = gguf_name.split(".", 2)
    sub = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }[rest]
    return f"model.layers.{layer}.{sub}"


def unpermute(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py's permute() on rows."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def weight_checks(gguf_path, model, cfg):
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    state = model.state_dict()
    stats = {}
    for name in STAT_TENSORS:
        t = tensors[name]
        raw = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        hf = state[hf_name(name)].detach().cpu().numpy()
        entry = {
            "hf_name": hf_name(name),
            "ggml_type": t.tensor_type.name,
            # numpy (row-major) shape of the dequantized tensor == HF [out, in]
            "shape": list(raw.shape),
            "sum": r6(raw.astype(np.float64).sum()),
            "sum_sq": r6((raw.astype(np.float64) ** 2).sum()),
            "first8_gguf_order": r6_list(raw.ravel()[:8]),
            "first8_hf_order": r6_list(hf.ravel()[:8]),
        }
        if ".attn_q." in name or ".attn_k." in name:
            n = cfg.num_attention_heads if ".attn_q." in name else cfg.num_key_value_heads
            entry["unpermute_n_head"] = n
            entry["max_abs_diff_hf_vs_gguf_raw"] = r6(np.abs(hf - raw).max())
            entry["max_abs_diff_hf_vs_gguf_unpermuted"] = r6(np.abs(hf - unpermute(raw, n)).max())
        else:
            entry["max_abs_diff_hf_vs_gguf_raw"] = r6(np.abs(hf - raw).max())
        stats[name] = entry
    type_counts = {}
    for t in reader.tensors:
        type_counts[t.tensor_type.name] = type_counts.get(t.tensor_type.name, 0) + 1
    has_output = "output.weight" in tensors
    return stats, type_counts, has_output


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf_path")
    ap.add_argument("output_json")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import gguf
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    gdir, gname = os.path.split(os.path.abspath(args.gguf_path))
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32)
    model.eval()
    cfg = model.config
    vocab = cfg.vocab_size
    assert next(model.parameters()).dtype == torch.float32

    rng = np.random.default_rng(SAMPLE_SEED)
    extra = rng.choice(np.arange(16, vocab), size=N_SAMPLE_RANDOM, replace=False)
    sample_ids = list(range(16)) + sorted(int(i) for i in extra)
    sample_idx = torch.tensor(sample_ids)

    gen_cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=N_GREEDY,
        min_new_tokens=0,
        eos_token_id=None,  # never stop early; also avoids min_new_tokens' eos masking
        pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0,
        bos_token_id=cfg.bos_token_id,
        repetition_penalty=1.0,
        use_cache=True,
    )

    # generate() fills unset (None) fields of gen_cfg from model.generation_config,
    # so eos must be cleared there too or generation stops at <|im_end|> (id 2).
    model.generation_config.eos_token_id = None

    out_dir = os.path.dirname(os.path.abspath(args.output_json))
    os.makedirs(out_dir, exist_ok=True)

    records = []
    for pi, prompt in enumerate(PROMPTS):
        ids = tok(prompt, add_special_tokens=False).input_ids
        ids_default = tok(prompt).input_ids
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0].float()  # [T, V]
        last = logits[-1]
        top_v, top_i = torch.topk(last, TOP_K)
        with torch.no_grad():
            gen = model.generate(x, generation_config=gen_cfg, attention_mask=torch.ones_like(x))
        new_ids = gen[0, len(ids):].tolist()
        assert len(new_ids) == N_GREEDY, len(new_ids)

        # Cross-check generate() against a plain argmax loop without KV cache.
        # Also record the top1 - top2 logit gap at each greedy step: a small gap
        # marks a step where a float32 reimplementation may legitimately diverge.
        seq = list(ids)
        margins = []
        with torch.no_grad():
            for _ in range(N_GREEDY):
                step = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
                v2, i2 = torch.topk(step, 2)
                margins.append(r6(v2[0] - v2[1]))
                seq.append(int(i2[0]))
        manual = seq[len(ids):]

        rec = {
            "prompt": prompt,
            "input_ids": ids,
            "last_logits_top": [[int(i), r6(v)] for i, v in zip(top_i.tolist(), top_v.tolist())],
            "logits_sample": [r6_list(row) for row in logits[:, sample_idx].numpy()],
            "greedy_ids": new_ids,
            "greedy_text": tok.decode(new_ids, skip_special_tokens=False),
            "greedy_matches_nocache_argmax_loop": manual == new_ids,
            "greedy_step_margins": margins,
            "last_logits_stats": {
                "mean": r6(last.double().mean()),
                "std": r6(last.double().std()),
                "argmax": int(last.argmax()),
            },
        }
        if manual != new_ids:
            rec["greedy_ids_nocache_argmax_loop"] = manual
        if ids_default != ids:
            rec["input_ids_add_special_tokens_true"] = ids_default
        records.append(rec)

        if pi == 0:
            path = os.path.join(out_dir, "france_last_logits.f32")
            last.numpy().astype("<f4").tofile(path)

        print(f"[{pi}] {prompt!r} -> {rec['greedy_text']!r}", file=sys.stderr)

    stats, type_counts, has_output = weight_checks(args.gguf_path, model, cfg)

    rope = getattr(cfg, "rope_parameters", None) or {}
    doc = {
        "model": "SmolLM2-135M-Instruct",
        "gguf_file": os.path.basename(args.gguf_path),
        "gguf_tensor_types": type_counts,
        "gguf_has_output_weight": has_output,
        "date": datetime.date.today().isoformat(),
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "numpy": np.__version__,
        },
        "dtype": "float32",
        "device": "cpu",
        "add_special_tokens": False,
        "float_rounding": "6 significant digits",
        "config": {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None),
            "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
            "rope_type": rope.get("rope_type"),
            "rope_scaling": getattr(cfg, "rope_scaling", None),
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "lm_head_shares_embed_storage": model.lm_head.weight.data_ptr()
            == model.model.embed_tokens.weight.data_ptr(),
            "hidden_act": cfg.hidden_act,
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id,
        },
        "tokenizer": {
            "class": type(tok).__name__,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "add_bos_token": getattr(tok, "add_bos_token", None),
        },
        "generation": {
            "method": "model.generate(do_sample=False, eos_token_id=None, repetition_penalty=1.0, use_cache=True)",
            "max_new_tokens": N_GREEDY,
        },
        "sample_ids": sample_ids,
        "sample_ids_rule": f"0..15 plus {N_SAMPLE_RANDOM} ids from numpy default_rng({SAMPLE_SEED}).choice(16..vocab-1, replace=False), sorted",
        "france_last_logits_file": "france_last_logits.f32 (vocab_size little-endian float32, last position of prompt 0)",
        "weight_stats": stats,
        "prompts": records,
    }
    with open(args.output_json, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.output_json} ({os.path.getsize(args.output_json)} bytes)", file=sys.stderr)


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
