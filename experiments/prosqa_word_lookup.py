#!/usr/bin/env python3
"""Does a model look up a concept's facts in words? Prompted with a ProsQA question and "Every X"
(X the subject of one of its facts, drawn per question), the share where the next token is one of
X's objects, and their mean probability.

Usage: prosqa_word_lookup.py MODEL_DIR DATA.json [COUNT]   (run from the repository or any folder:
build/coconut is found next to this script)

DATA: a ProsQA file without the copula ("Every X Y."; experiments/prosqa_without_copula.py). One
`coconut tokenize` for all prompts, then one `coconut logits` per prompt. Standard library only.
"""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

COCONUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "coconut")


def last_row(path):
    """The last row of the float32 [T, V] tensor 'logits' of a safetensors file."""
    raw = open(path, "rb").read()
    header_size = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8:8 + header_size])["logits"]
    rows, width = entry["shape"]
    start = 8 + header_size + entry["data_offsets"][0] + (rows - 1) * width * 4
    return struct.unpack(f"<{width}f", raw[start:start + width * 4])


def main(model, data_path, count=100):
    vocab = json.load(open(os.path.join(model, "tokenizer.json")))["model"]["vocab"]
    rng = random.Random(5)
    prompts, objects = [], []
    for example in json.load(open(data_path))[:count]:
        facts = {}
        for sentence in example["question"].split("."):
            words = sentence.split()
            if len(words) == 3 and words[0] == "Every":
                facts.setdefault(words[1], set()).add(words[2])
        subject = rng.choice(sorted(facts))
        prompts.append(example["question"] + " Every " + subject)
        objects.append([vocab[name] for name in facts[subject]])
    encoded = subprocess.run([COCONUT, "tokenize", "--tokenizer", model, "--add-special-tokens"], input="\n".join(prompts),
                             capture_output=True, text=True, check=True).stdout.split("\n")
    mass = hits = 0.0
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "logits.safetensors")
        for ids, wanted in zip(encoded, objects):
            subprocess.run([COCONUT, "logits", "--model", model, "--ids", ids.replace(" ", ","), "--out", out, "--force"],
                           check=True, capture_output=True)
            logits = last_row(out)
            top = max(logits)
            weights = [math.exp(value - top) for value in logits]
            total = sum(weights)
            mass += sum(weights[i] for i in wanted) / total
            hits += max(range(len(logits)), key=lambda i: logits[i]) in wanted
    n = len(objects)
    print(f"{model}: the next token one of the subject's objects in {hits / n:.0%} of {n}, mean mass {mass / n:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
