#!/usr/bin/env python3
"""Rewrite a word-forms tokenizer.json trained on text where "is a"/"is an" were spelled "isa"/"isan"
(the articles-joined experiment of issue 19) into the `articles: joined` tokenizer that reads the
released text: the tokens are renamed "is~a"/"is~an" (same ids, so the model's embedding rows are
unchanged) and "joined": ["a", "an"] is added to the WordForms pre-tokenizer and decoder.

With --marked-not, the text also had "not X" spelled "not X not" under `negation: fused` (run x6):
the second "not" (the only "not" that fused negation leaves on its own in ProntoQA) is renamed to the
mark "~not" and "not" becomes a postfix word as well, which is `negation: fused_marked`.

    python3 experiments/released_text_vocab.py [--marked-not] MODEL_DIR/tokenizer.json
Standard library only; rewrites the file in place (through a temporary file).
"""
import json
import os
import sys

marked_not = "--marked-not" in sys.argv[1:]
path = [arg for arg in sys.argv[1:] if arg != "--marked-not"][0]
tokenizer = json.load(open(path))
vocab = tokenizer["model"]["vocab"]
renames = [("isa", "is~a"), ("isan", "is~an")] + ([("not", "~not")] if marked_not else [])
for old, new in renames:
    if old in vocab:
        vocab[new] = vocab.pop(old)
for node in (tokenizer["pre_tokenizer"], tokenizer["decoder"]):
    assert node["type"] == "WordForms", node
    node["joined"] = ["a", "an"]
    if marked_not:
        assert node.get("fused") == ["not"], node
        node["postfix"] = ["not"]
with open(path + ".tmp", "w") as out:
    json.dump(tokenizer, out, indent=2)
    out.write("\n")
os.replace(path + ".tmp", path)
