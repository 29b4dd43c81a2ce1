#!/usr/bin/env python3
"""ProsQA questions whose other option only a lookup between concepts rules out.

Usage: prosqa_concept_negatives.py IN.json OUT.json SEED

For each question of IN (a ProsQA file from `coconut data --task prosqa`, either spelling), the other
option (neg_target) is replaced by a node that, like a node two or more edges from the root, is the
object of a fact about a concept ("Every X is a Y."), but whose every parent is a concept the root
does not reach, and that the root does not reach itself. Then "is it a concept's child rather than
a person's" no longer separates the two options: only finding the facts whose subject the thought
holds does. Questions without such a node are dropped. The query's option order is drawn again.
Standard library only.
"""
import json
import random
import re
import sys

from prosqa_graph import hops


def main(in_path, out_path, seed):
    rng = random.Random(seed)
    kept = []
    data = json.load(open(in_path))
    for example in data:
        symbols, edges, root = example["idx_to_symbol"], example["edges"], int(example["root"])
        target = int(example["target"])
        reached = set().union(*hops(edges, root))
        is_person = [name[:1].isupper() for name in symbols]
        parents = {}
        for a, b in edges:
            parents.setdefault(b, set()).add(a)
        candidates = [node for node, ps in sorted(parents.items())
                      if node not in reached and node != root and all(not is_person[p] and p not in reached for p in ps)]
        if not candidates:
            continue
        negative = rng.choice(candidates)
        options = [symbols[target], symbols[negative]]
        rng.shuffle(options)
        question, count = re.subn(r"Is (\w+) a (\w+) or (\w+)\?$", f"Is \\1 a {options[0]} or {options[1]}?",
                                  example["question"])
        if count != 1:
            raise SystemExit(f"{in_path}: a question does not end in 'Is X a Y or Z?': {example['question'][-80:]}")
        kept.append(dict(example, question=question, neg_target=negative))
    json.dump(kept, open(out_path, "w"))
    print(f"wrote {len(kept)} of {len(data)} questions to {out_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
