#!/usr/bin/env python3
"""ProsQA questions whose chain of thought is the breadth-first search, one step per hop.

Usage: prosqa_bfs_steps.py IN.json OUT.json SEED
       prosqa_bfs_steps.py --score EVAL_OUT.jsonl BFS.json   (a CoT model's chains, `coconut eval --out`)

Step k lists the nodes first reached at hop k from the root ("terpus dumpus." then "brimpus gerpus
lorpus."), in an order drawn per question (a set has none; each listed node is then a target the
model can reach by looking up the facts whose subject the step before lists), up to the hop that
reaches one of the two options. ProsQA's own chain is one path, which needs looking ahead to choose
each hop; this one needs none: the answer is the option that appears. As Coconut steps, thought k
stands for that set, the form Zhu et al. 2025 find continuous thoughts take. Questions, answers and
graphs are kept. With --score: per hop, the share of the nodes a generated step lists that are
that hop's (precision), and of that hop's nodes that it lists (recall). Standard library only.
"""
import json
import random
import sys

from prosqa_graph import hops


def main(in_path, out_path, seed):
    rng = random.Random(seed)
    data = json.load(open(in_path))
    for example in data:
        symbols, root = example["idx_to_symbol"], int(example["root"])
        options = {int(example["target"]), int(example["neg_target"])}
        steps = []
        for hop in hops(example["edges"], root):
            listed = sorted(hop)
            rng.shuffle(listed)
            steps.append(" ".join(symbols[n] for n in listed) + ".")
            if options & hop:
                break
        example["steps"] = steps
    json.dump(data, open(out_path, "w"))
    lengths = sorted(len(e["steps"]) for e in data)
    print(f"wrote {len(data)} questions to {out_path}; steps per question {lengths[0]}-{lengths[-1]}, "
          f"median {lengths[len(lengths) // 2]}")


def score(eval_path, data_path):
    data = json.load(open(data_path))
    listed, right, wanted = {}, {}, {}  # per hop: nodes listed, of them right, nodes of the hop
    for line in open(eval_path):
        record = json.loads(line)
        gold = [set(step.rstrip(".").split()) for step in data[record["index"]]["steps"]]
        chain = record["generated"].split("###")[0]
        generated = [set(step.split()) for step in chain.split(".") if step.strip()]
        for hop, nodes in enumerate(generated[:len(gold)]):
            listed[hop] = listed.get(hop, 0) + len(nodes)
            right[hop] = right.get(hop, 0) + len(nodes & gold[hop])
        for hop, nodes in enumerate(gold):
            wanted[hop] = wanted.get(hop, 0) + len(nodes)
    print(", ".join(f"hop {hop + 1}: precision {right.get(hop, 0) / max(listed.get(hop, 0), 1):.2f} "
                    f"recall {right.get(hop, 0) / wanted[hop]:.2f}" for hop in sorted(wanted)))


if __name__ == "__main__":
    if sys.argv[1] == "--score":
        score(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
