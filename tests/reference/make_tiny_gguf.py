"""A tiny llama GGUF with a real tokenizer: every tokenizer.* key of SOURCE copied, random weights
in the block formats a downloaded model uses (Q8_0 embedding, Q4_1 / Q5_0 / Q4_0 / Q5_1 matrices,
Q6_K down projections, F32 norms), 2 layers, width 64, 4 heads, 2 KV heads, FFN 256.

    make_tiny_gguf.py SOURCE.gguf OUT.gguf [--untied] [--dequantized OUT_REFERENCE.gguf] [--pre NAME]

--untied adds output.weight (Q8_0); --dequantized also writes every tensor as gguf-py dequantizes
it (float32, same names, rows as stored: attn_q / attn_k still in llama.cpp's permuted order);
--pre replaces tokenizer.ggml.pre (to test another pre-tokenizer over the same vocabulary).
tests/fixtures/gguf/smollm2-tiny-q.gguf was made from SmolLM2-135M-Instruct.Q4_1.gguf with this.
"""
import argparse

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

T = gguf.GGMLQuantizationType
LAYERS, WIDTH, HEADS, KV_HEADS, FFN = 2, 64, 4, 2, 256


def random_q6_k(rng, rows, columns):
    block_size, type_size = gguf.GGML_QUANT_SIZES[T.Q6_K]
    data = rng.integers(0, 256, size=(rows, columns // block_size, type_size), dtype=np.uint8)
    scale = rng.normal(0, 0.002, size=(rows, columns // block_size)).astype(np.float16)
    data[:, :, 208:210] = scale.view(np.uint8).reshape(rows, columns // block_size, 2)
    return data.reshape(rows, -1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--untied", action="store_true")
    parser.add_argument("--dequantized")
    parser.add_argument("--pre")
    args = parser.parse_args()
    source = gguf.GGUFReader(args.source)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(20261127)
    writers = [gguf.GGUFWriter(args.out, "llama")]
    if args.dequantized:
        writers.append(gguf.GGUFWriter(args.dequantized, "llama"))
    model, reference = writers[0], writers[-1] if args.dequantized else None
    model.add_name("tiny-random-llama")
    model.add_context_length(2048)
    model.add_embedding_length(WIDTH)
    model.add_block_count(LAYERS)
    model.add_feed_forward_length(FFN)
    model.add_head_count(HEADS)
    model.add_head_count_kv(KV_HEADS)
    model.add_rope_freq_base(100000.0)
    model.add_layer_norm_rms_eps(1e-5)
    model.add_rope_dimension_count(WIDTH // HEADS)
    model.add_vocab_size(vocab)
    for name, field in source.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if name == "tokenizer.ggml.pre" and args.pre:
            model.add_key_value(name, args.pre, kind)
        elif kind == gguf.GGUFValueType.ARRAY:
            model.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            model.add_key_value(name, field.contents(), kind)

    def add(name, values, qtype):
        if qtype == T.F32:
            stored = values.astype(np.float32)
        elif qtype == T.Q6_K:
            stored = values
        else:
            stored = quantize(values.astype(np.float32), qtype)
        if qtype == T.F32:
            model.add_tensor(name, stored)
        else:  # rows of bytes; gguf-py derives the element shape
            model.add_tensor(name, stored, raw_dtype=qtype)
        if reference:
            reference.add_tensor(name, stored if qtype == T.F32 else dequantize(stored, qtype).astype(np.float32))

    add("token_embd.weight", rng.normal(0, 0.5, size=(vocab, WIDTH)), T.Q8_0)
    add("output_norm.weight", 1 + rng.normal(0, 0.1, size=WIDTH), T.F32)
    if args.untied:
        add("output.weight", rng.normal(0, 0.5, size=(vocab, WIDTH)), T.Q8_0)
    head_dim = WIDTH // HEADS
    for layer in range(LAYERS):
        blk = f"blk.{layer}."
        add(blk + "attn_norm.weight", 1 + rng.normal(0, 0.1, size=WIDTH), T.F32)
        add(blk + "attn_q.weight", rng.normal(0, 0.3, size=(HEADS * head_dim, WIDTH)), T.Q4_1)
        add(blk + "attn_k.weight", rng.normal(0, 0.3, size=(KV_HEADS * head_dim, WIDTH)), T.Q5_0)
        add(blk + "attn_v.weight", rng.normal(0, 0.3, size=(KV_HEADS * head_dim, WIDTH)), T.Q4_0)
        add(blk + "attn_output.weight", rng.normal(0, 0.2, size=(WIDTH, HEADS * head_dim)), T.Q5_1)
        add(blk + "ffn_norm.weight", 1 + rng.normal(0, 0.1, size=WIDTH), T.F32)
        add(blk + "ffn_gate.weight", rng.normal(0, 0.3, size=(FFN, WIDTH)), T.Q4_1)
        add(blk + "ffn_up.weight", rng.normal(0, 0.3, size=(FFN, WIDTH)), T.Q8_0)
        add(blk + "ffn_down.weight", random_q6_k(rng, WIDTH, FFN), T.Q6_K)
    for writer in writers:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


if __name__ == "__main__":
    main()
