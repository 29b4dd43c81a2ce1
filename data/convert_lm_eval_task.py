#!/usr/bin/env python3
"""Convert a benchmark's raw file into the JSONL that `coconut eval-lm` reads.

    python3 data/convert_lm_eval_task.py TASK RAW [--out FILE]
    python3 data/convert_lm_eval_task.py wikitext2 RAW_LINES TOKENS [--out FILE]

Multiple-choice tasks give one JSON object per line:
    {"id": str, "context": str, "choices": [str, ...], "label": int}
built exactly as lm-evaluation-harness v0.4 builds its requests (the task YAMLs in
lm_eval/tasks/): context = doc_to_text + target_delimiter (" "), choices = doc_to_choice
(without the delimiter), label = doc_to_target.  lm-eval scores `context + delimiter + choice`
and moves the context's trailing space onto the continuation before tokenizing, and its
acc_norm divides by len(choice); keeping the delimiter at the end of `context` reproduces both.

RAW may be a .jsonl file (one record a line) or a .json list.  Accepted record layouts:
  arc_challenge  HF allenai/ai2_arc {"id","question","choices":{"text","label"},"answerKey"}
                 or AI2's original {"id","question":{"stem","choices":[{"text","label"}]},"answerKey"}
  openbookqa     HF allenai/openbookqa {"id","question_stem","choices":{...},"answerKey"},
                 AI2's original (as ARC), or SWAG style {"id","sent1","ending0".."ending3","label"}
  sciq           HF allenai/sciq or AI2's original test.json {"question","distractor1..3","correct_answer","support"}
  hellaswag      HF Rowan/hellaswag or rowanz/hellaswag's hellaswag_val.jsonl
  copa           HF super_glue/copa or SuperGLUE's COPA/val.jsonl
wikitext2 rebuilds wiki.test.raw from a copy that kept only its non-blank lines (RAW_LINES, any
line ending) and the tokenized wiki.test.tokens (TOKENS), whose lines are the same lines with rare
words as <unk> and whose blank lines (" ") sit where the raw file's do.  It checks that every line
pair agrees word for word up to <unk> before writing.
Standard library only.
"""
import argparse
import json
import re
import sys


def read_records(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def choices_and_key(doc):
    """(texts, labels) from either the HF flat layout or AI2's nested one."""
    if isinstance(doc.get("question"), dict):  # AI2 original: question.stem, question.choices
        cs = doc["question"]["choices"]
        return doc["question"]["stem"], [c["text"] for c in cs], [c["label"] for c in cs]
    stem = doc.get("question_stem", doc.get("question"))
    return stem, doc["choices"]["text"], doc["choices"]["label"]


def arc_challenge(doc, i):
    # arc_easy.yaml (arc_challenge.yaml includes it), version 1.0
    question, texts, labels = choices_and_key(doc)
    return doc["id"], f"Question: {question}\nAnswer:", texts, labels.index(doc["answerKey"])


def openbookqa(doc, i):
    # openbookqa.yaml, version 1.0: doc_to_text question_stem; target labels.index(answerKey.lstrip())
    if "sent1" in doc:  # SWAG-style export of the same split
        return doc["id"], doc["sent1"], [doc[f"ending{k}"] for k in range(4)], int(doc["label"])
    stem, texts, labels = choices_and_key(doc)
    return doc["id"], stem, texts, labels.index(doc["answerKey"].lstrip())


def sciq(doc, i):
    # sciq.yaml, version 1.0: the correct answer is always the 4th choice
    text = f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:"
    choices = [doc["distractor1"], doc["distractor2"], doc["distractor3"], doc["correct_answer"]]
    return str(doc.get("id", i)), text, choices, 3


def _hellaswag_pre(text):  # hellaswag/utils.py: preprocess
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag(doc, i):
    # hellaswag.yaml, version 1.0, with utils.process_docs
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    query = _hellaswag_pre(doc["activity_label"] + ": " + ctx)
    return str(doc.get("ind", i)), query, [_hellaswag_pre(e) for e in doc["endings"]], int(doc["label"])


def copa(doc, i):
    # super_glue/copa/default.yaml, version 1.0, with utils.py; its choices begin with a space
    connector = {"cause": "because", "effect": "therefore"}[doc["question"]]
    conv = lambda c: " " + c[0].lower() + c[1:]
    return (str(doc.get("idx", i)), doc["premise"].strip()[:-1] + f" {connector}",
            [conv(doc["choice1"]), conv(doc["choice2"])], int(doc["label"]))


TASKS = {"arc_challenge": arc_challenge, "openbookqa": openbookqa, "sciq": sciq,
         "hellaswag": hellaswag, "copa": copa}
TARGET_DELIMITER = " "  # none of these YAMLs sets target_delimiter


def convert(task, raw):
    out = []
    for i, doc in enumerate(read_records(raw)):
        id_, text, choices, label = TASKS[task](doc, i)
        assert 0 <= label < len(choices), (id_, label)
        assert text and all(choices), id_
        out.append(json.dumps({"id": str(id_), "context": text + TARGET_DELIMITER,
                               "choices": choices, "label": label}, ensure_ascii=False) + "\n")
    return "".join(out)


def wikitext2(raw_lines_path, tokens_path):
    raw = open(raw_lines_path, encoding="utf-8", newline="").read().replace("\r\n", "\n")
    raw = [l for l in raw.split("\n") if l.strip()]
    tokens = open(tokens_path, encoding="utf-8", newline="").read().split("\n")
    assert tokens[-1] == "", "tokens file must end with a newline"
    tokens = tokens[:-1]
    nonblank = [t for t in tokens if t.strip()]
    assert len(nonblank) == len(raw), (len(nonblank), len(raw))
    for r, t in zip(raw, nonblank):
        # the same words, some as <unk>; the raw text has two lines with a double space
        rw, tw = r.split(), t.split()
        assert len(rw) == len(tw) and all(a == b or b == "<unk>" for a, b in zip(rw, tw)), r[:60]
    it = iter(raw)
    return "".join((next(it) if t.strip() else " ") + "\n" for t in tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=sorted(TASKS) + ["wikitext2"])
    ap.add_argument("raw", nargs="+")
    ap.add_argument("--out", help="output file (default: stdout)")
    a = ap.parse_args()
    text = wikitext2(*a.raw) if a.task == "wikitext2" else convert(a.task, *a.raw)
    if a.out:
        with open(a.out, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
