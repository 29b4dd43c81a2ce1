#!/usr/bin/env python3
"""A word-forms model trained on ProsQA text without the copula ("Every A B.", the name-match and
breadth-first runs, experiments/prosqa_without_copula.py) made into one that reads the released text
with `articles: joined_postfix`: "Every A is a B." -> every A B ~is~a . (the same tokens plus one mark
behind each fact), and its answers decode to "Tom is a B." as the released answers read.

The tokens "~is~a" and "~is~an" are added at the end of the vocabulary, their embedding rows copies of
the row of "." (the token the mark stands in front of), and "a", "an" become postfix words of the
WordForms pre-tokenizer and decoder. The model then needs a little training on text with the copula
to use the mark; until then it computes what it did on the text without.

    python3 experiments/articles_behind_vocab.py MODEL_DIR OUT_DIR
Standard library only; needs a tied, float32, single-file checkpoint (as the runs here are).
"""
import json
import os
import shutil
import struct
import sys

EMBED = "model.embed_tokens.weight"
NEW_TOKENS = ["~is~a", "~is~an"]


def read_safetensors(path):
    blob = open(path, "rb").read()
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_size])
    data = blob[8 + header_size:]
    metadata = header.pop("__metadata__", None)
    tensors = {name: (info, data[info["data_offsets"][0]:info["data_offsets"][1]]) for name, info in header.items()}
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    header, chunks, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (info, raw) in tensors.items():
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path + ".tmp", "wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
    os.replace(path + ".tmp", path)


def main(model_dir, out_dir):
    config = json.load(open(os.path.join(model_dir, "config.json")))
    tokenizer = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    if not config.get("tie_word_embeddings"):
        sys.exit(f"{model_dir}: config.json: needs tie_word_embeddings (lm_head would need the rows too)")
    vocab = tokenizer["model"]["vocab"]
    if any(token in vocab for token in NEW_TOKENS):
        sys.exit(f"{model_dir}: tokenizer.json already has {NEW_TOKENS}")
    tensors, metadata = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    info, raw = tensors[EMBED]
    rows, width = info["shape"]
    if info["dtype"] != "F32" or rows != config["vocab_size"] or rows != len(vocab):
        sys.exit(f"{model_dir}: {EMBED} is {info['dtype']} {info['shape']}, expected F32 [{len(vocab)}, D]")
    row_bytes = 4 * width
    period = vocab["."]
    raw += raw[period * row_bytes:(period + 1) * row_bytes] * len(NEW_TOKENS)
    tensors[EMBED] = ({"dtype": "F32", "shape": [rows + len(NEW_TOKENS), width]}, raw)
    for offset, token in enumerate(NEW_TOKENS):
        vocab[token] = rows + offset
    for node in (tokenizer["pre_tokenizer"], tokenizer["decoder"]):
        if node.get("type") != "WordForms" or node.get("joined") != ["a", "an"]:
            sys.exit(f"{model_dir}: tokenizer.json: needs WordForms with joined [a, an], got {node}")
        node["postfix"] = node.get("postfix", []) + ["a", "an"]
    config["vocab_size"] = rows + len(NEW_TOKENS)

    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(model_dir, out_dir)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, metadata)
    for name, document in (("config.json", config), ("tokenizer.json", tokenizer)):
        with open(os.path.join(out_dir, name), "w") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    print(f"{out_dir}: vocabulary {rows} -> {rows + len(NEW_TOKENS)} ({', '.join(NEW_TOKENS)} as copies of '.')")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
