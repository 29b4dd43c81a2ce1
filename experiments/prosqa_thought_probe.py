#!/usr/bin/env python3
"""What a ProsQA Coconut model's thoughts hold, per thought, from `coconut eval --thought-top K`.

Usage: prosqa_thought_probe.py EVAL_OUT.jsonl DATA.json [--from-root]

EVAL_OUT.jsonl comes from `coconut eval --model M --data DATA.json --thought-top 73 --out ...` (K at
least the vocabulary, so every token's probability is there). For each thought j it prints:
- target_over_negative: the share of questions where the answer option (target) gets more
  probability than the other option (neg_target); 50% is a coin toss;
- children_in_top: the share where the first thought's top-k tokens (k = the number of root's
  children) are all children of the root (only for thought 1);
- mass_on_reachable: the mean probability mass on the nodes within j + 1 edges of the root.
- first hop: the mass the first hop's thought (thought 1; with --from-root thought 2) puts on the
  root's children, on the root, and on the children of the other people (each question's graph has
  two to six people, only one of them the root): a retrieval that matches the root by name puts
  little on the others' children.
- next hop: the thought after it, its mass per node on the root's grandchildren, on the children
  of other people and on the children of concepts, both kinds of node the root does not reach:
  alike when the hop between concepts has no match (it reads every fact's object), and the
  people's children lower when it only tells a concept's fact from a person's.
With --from-root (a model trained with `thought_reachable_start: root`) thought j's set is the nodes
within j edges with the root, and the children check reads thought 2 (the root and its children).
A node's token is its name's last word in lower case (word-forms vocabulary: one token per concept).
"""
import ast
import json
import sys


def field(example, key):
    value = example[key]
    return ast.literal_eval(value) if isinstance(value, str) else value


def main(eval_path, data_path, from_root=False):
    data = json.load(open(data_path))
    records = [json.loads(line) for line in open(eval_path)]
    per_thought = {}
    children_hits = 0
    first_hop = {"children": 0.0, "root": 0.0, "others' children": 0.0}
    second_hop = {"root's grandchildren": [0.0, 0], "other people's children": [0.0, 0],
                  "other concepts' children": [0.0, 0]}  # mass, nodes
    for record in records:
        example = data[record["index"]]
        symbols = field(example, "idx_to_symbol")
        names = [name.lower() for name in symbols]
        edges = field(example, "edges")
        root = int(field(example, "root"))
        target, negative = names[int(field(example, "target"))], names[int(field(example, "neg_target"))]
        children = {}
        for a, b in edges:
            children.setdefault(a, []).append(b)
        frontier, reached, within = {root}, ({root} if from_root else set()), []
        if from_root:
            within.append({names[root]})
        for _ in range(len(record["thought_top"])):
            frontier = {c for node in frontier for c in children.get(node, [])} - reached
            reached |= frontier
            within.append({names[n] for n in reached})
        for j, top in enumerate(record["thought_top"]):
            probability = {token.strip().lower(): p for token, p in top}
            stats = per_thought.setdefault(j, {"over": 0, "mass": 0.0})
            stats["over"] += probability.get(target, 0.0) > probability.get(negative, 0.0)
            stats["mass"] += sum(probability.get(name, 0.0) for name in within[j])
        first = 1 if from_root else 0  # the thought that holds the root's children
        root_children = {names[c] for c in children.get(root, [])}
        first_children = root_children | ({names[root]} if from_root else set())
        ranked = [token.strip().lower() for token, _ in record["thought_top"][first]]
        children_hits += set(ranked[: len(first_children)]) == first_children
        people = {a for a, _ in edges if symbols[a][:1].isupper()}  # people's names are capitalised
        people_children = {names[b] for a, b in edges if a in people and a != root}
        others_children = people_children - root_children
        hop = {token.strip().lower(): p for token, p in record["thought_top"][first]}
        first_hop["children"] += sum(hop.get(name, 0.0) for name in root_children)
        first_hop["root"] += hop.get(names[root], 0.0)
        first_hop["others' children"] += sum(hop.get(name, 0.0) for name in others_children)
        # The next hop, per node: the root's grandchildren against the children of other people and
        # of concepts that the root does not reach (a match between concepts puts mass on the first).
        grandchildren = {names[c] for b in children.get(root, []) for c in children.get(b, [])} - root_children
        reached_names = {names[node] for node in reached}
        others_only = people_children - reached_names
        concepts_only = {names[b] for a, b in edges if a not in people and a != root and a not in reached} \
            - reached_names - people_children
        second = {token.strip().lower(): p for token, p in record["thought_top"][first + 1]}
        for key, nodes in (("root's grandchildren", grandchildren), ("other people's children", others_only),
                           ("other concepts' children", concepts_only)):
            second_hop[key][0] += sum(second.get(name, 0.0) for name in nodes)
            second_hop[key][1] += len(nodes)
    n = len(records)
    for j, stats in sorted(per_thought.items()):
        print(f"thought {j + 1}: target_over_negative {stats['over'] / n:.1%}, mass_on_reachable {stats['mass'] / n:.3f}")
    which = "thought 2: its top tokens are exactly the root and its children" if from_root else \
        "thought 1: its top tokens are exactly the root's children"
    print(f"{which} in {children_hits / n:.1%} of {n} questions")
    print("first hop, mean mass on: " + ", ".join(f"{key} {value / n:.3f}" for key, value in first_hop.items()))
    print("next hop, mass per node on: " + ", ".join(f"{key} {mass / max(nodes, 1):.3f}"
                                                     for key, (mass, nodes) in second_hop.items()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--from-root" in sys.argv[3:])
