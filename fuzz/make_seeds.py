#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/ from files in this repository (standard library only).

Seeds are small, valid inputs of each format: libFuzzer mutates them, so they should reach every
branch a valid file takes. Re-run after changing a format; the output is committed.
"""
import json
import os
import struct
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as out:
        out.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def safetensors_file(tensors, metadata=None):
    """tensors: name -> (dtype, shape, raw bytes)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def gguf_string(text):
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_file():
    """GGUF v3: three metadata values (string, u32, array of i32) and two tensors (F32 [4], F16 2x2)."""
    metadata = [
        gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama"),
        gguf_string("llama.block_count") + struct.pack("<I", 4) + struct.pack("<I", 1),
        gguf_string("tokenizer.ggml.token_type") + struct.pack("<I", 9) + struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3),
    ]
    tensors = [
        gguf_string("a.weight") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<I", 0) + struct.pack("<Q", 0),
        gguf_string("b.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 2, 2) + struct.pack("<I", 1) + struct.pack("<Q", 32),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + b"".join(metadata) + b"".join(tensors)
    head += b"\0" * ((32 - len(head) % 32) % 32)
    data = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0) + b"\0" * 16 + struct.pack("<4e", 1.0, 2.0, -1.0, 0.25)
    return head + data


def gguf_value(kind, payload):
    return struct.pack("<I", kind) + payload


def gguf_string_array(items):
    return gguf_value(9, struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(item) for item in items))


def gguf_quantized_file():
    """A one-layer-less llama GGUF: Q8_0 [32], Q4_K and Q6_K [256] blocks (finite float16 scales), and a
    gpt2 tokenizer (pre-tokenizer smollm, three tokens, one merge) for the importer's readers."""
    metadata = [
        gguf_string("general.architecture") + gguf_value(8, gguf_string("llama")),
        gguf_string("llama.embedding_length") + gguf_value(4, struct.pack("<I", 32)),
        gguf_string("tokenizer.ggml.model") + gguf_value(8, gguf_string("gpt2")),
        gguf_string("tokenizer.ggml.pre") + gguf_value(8, gguf_string("smollm")),
        gguf_string("tokenizer.ggml.tokens") + gguf_string_array(["a", "b", "ab"]),
        gguf_string("tokenizer.ggml.merges") + gguf_string_array(["a b"]),
        gguf_string("tokenizer.ggml.eos_token_id") + gguf_value(4, struct.pack("<I", 2)),
    ]
    blocks = [("token_embd.weight", [32], 8, struct.pack("<e", 0.5) + bytes(range(32))),
              ("q4k", [256], 12, struct.pack("<ee", 0.25, 0.125) + bytes(range(12)) + bytes(range(128))),
              ("q6k", [256], 14, bytes(range(128)) + bytes(range(64)) + bytes(range(16)) + struct.pack("<e", 0.01))]
    tensors, data = [], b""
    for name, dims, kind, payload in blocks:
        tensors.append(gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) +
                       struct.pack("<I", kind) + struct.pack("<Q", len(data)))
        data += payload + b"\0" * ((32 - len(payload) % 32) % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + b"".join(metadata) + b"".join(tensors)
    head += b"\0" * ((32 - len(head) % 32) % 32)
    return head + data


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    write("tokenizer_json", "stories260K.json", read("tests/fixtures/models/stories260K/tokenizer.json"))
    word_level = {
        "version": "1.0", "added_tokens": [{"id": 0, "content": "<unk>", "special": True}],
        "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "<cap>": 1, "brimpus": 2, "##es": 3, "are": 4,
                                                  "not~wooden": 5, "not": 6, ".": 7, "wooden": 8},
                  "unk_token": "<unk>"},
        "pre_tokenizer": {"type": "WordForms", "case_marker": "<cap>", "suffixes": ["##es"], "fused": ["not"]},
        "decoder": {"type": "WordForms", "case_marker": "<cap>", "fused": ["not"]}}
    write("tokenizer_json", "word_forms.json", json.dumps(word_level))
    # Marked negation ("not" both fused and postfix: "not~wooden ~not") and joined articles ("is~a").
    marked = json.loads(json.dumps(word_level))
    marked["model"]["vocab"].update({"~not": 9, "is~a": 10, "is": 11, "a": 12})
    for node in (marked["pre_tokenizer"], marked["decoder"]):
        node["postfix"] = ["not"]
        node["joined"] = ["a", "an"]
    write("tokenizer_json", "word_forms_marked.json", json.dumps(marked))
    byte_level = {
        "added_tokens": [{"id": 6, "content": "<|end|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|end|>"}}, {"Sequence": {"id": "A"}}],
                           "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [6]}}},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4, "Ġab": 5}, "merges": ["a b", "Ġ a", "Ġa b"]}}
    write("tokenizer_json", "byte_level.json", json.dumps(byte_level))

    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    write("safetensors", "two.safetensors", safetensors_file(
        {"a.weight": ("F32", [2, 3], f32), "b": ("BF16", [4], struct.pack("<4H", 0x3f80, 0x4000, 0xbf80, 0))},
        {"format": "pt"}))
    write("safetensors", "empty.safetensors", safetensors_file({}))

    write("gguf", "tiny.gguf", gguf_file())
    write("gguf", "quantized.gguf", gguf_quantized_file())

    write("model_config", "stories260K.json", read("tests/fixtures/models/stories260K/config.json"))
    write("model_config", "llama3.2-1b.json", read("tests/fixtures/tokenizers/llama3/config.json"))
    pruned = json.loads(read("tests/fixtures/models/stories260K/config.json"))
    pruned["layer_num_attention_heads"] = [8, 6, 8, 8, 4]
    pruned["layer_num_key_value_heads"] = [4, 3, 4, 4, 2]
    pruned["layer_intermediate_size"] = [172, 100, 172, 172, 64]
    write("model_config", "pruned.json", json.dumps(pruned))

    prontoqa = json.loads(read("data/prontoqa/valid.json"))[:2]
    write("dataset", "prontoqa.json", b"\0" + json.dumps(prontoqa).encode())
    gsm8k = [{"question": e["question"], "answer": "\n".join(e["steps"]) + "\n#### " + e["answer"]}
             for e in json.loads(read("data/gsm8k/valid.json"))[:2]]  # the original GSM8K layout
    write("dataset", "gsm8k.jsonl", b"\1" + b"".join(json.dumps(e).encode() + b"\n" for e in gsm8k))
    write("dataset", "icot.txt", b"\2" + b"".join(read("data/icot/4_by_4_mult/valid.txt").splitlines(keepends=True)[:2]))

    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if name.endswith(".yaml") and not name.startswith("sweep"):  # sweeps have their own format
            write("train_config", name, read(os.path.join("configs", name)))


if __name__ == "__main__":
    main()
