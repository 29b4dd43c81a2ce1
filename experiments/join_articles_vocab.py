#!/usr/bin/env python3
"""Rewrite a word-forms tokenizer.json trained on text where "is a"/"is an" were spelled "isa"/"isan"
(the articles-joined experiment of issue 19) into the `articles: joined` tokenizer that reads the
released text: the tokens are renamed "is~a"/"is~an" (same ids, so the model's embedding rows are
unchanged) and "joined": ["a", "an"] is added to the WordForms pre-tokenizer and decoder.

    python3 experiments/join_articles_vocab.py MODEL_DIR/tokenizer.json
Standard library only; rewrites the file in place (through a temporary file).
"""
import json
import os
import sys

path = sys.argv[1]
tokenizer = json.load(open(path))
vocab = tokenizer["model"]["vocab"]
for old, new in (("isa", "is~a"), ("isan", "is~an")):
    if old in vocab:
        vocab[new] = vocab.pop(old)
for node in (tokenizer["pre_tokenizer"], tokenizer["decoder"]):
    assert node["type"] == "WordForms", node
    node["joined"] = ["a", "an"]
with open(path + ".tmp", "w") as out:
    json.dump(tokenizer, out, indent=2)
    out.write("\n")
os.replace(path + ".tmp", path)
