#!/usr/bin/env python3
"""Rewrite a ProntoQA json file (question, steps, answer) with the spellings that runs x1-x6 of
issue 19 trained on, before the tokenizer could produce them itself:

    --isa          "is a" -> "isa", "is an" -> "isan" (what `articles: joined` now does as "is~a")
    --marked-not   "not X" -> "not X not" (with `negation: fused`: "not~X not", what
                   `negation: fused_marked` now does as "not~X ~not")

    python3 experiments/prontoqa_respell.py [--isa] [--marked-not] IN.json OUT.json
Standard library only. experiments/released_text_vocab.py turns a model trained on such text
back into one that reads the released text.
"""
import json
import re
import sys

flags = [arg for arg in sys.argv[1:] if arg.startswith("--")]
source, target = [arg for arg in sys.argv[1:] if not arg.startswith("--")]


def respell(text):
    if "--isa" in flags:
        text = re.sub(r"\bis an\b", "isan", re.sub(r"\bis a\b", "isa", text))
    if "--marked-not" in flags:
        text = re.sub(r"\bnot (\w+)", r"not \1 not", text)
    return text


examples = json.load(open(source))
for example in examples:
    example["question"] = respell(example["question"])
    example["steps"] = [respell(step) for step in example["steps"]]
json.dump(examples, open(target, "w"))
