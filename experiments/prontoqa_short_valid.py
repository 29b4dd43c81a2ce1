#!/usr/bin/env python3
"""ProntoQA questions with their distractors dropped as the training curriculum drops them
(`drop_unused_facts` with `keep_query_distractors`): each fact that no step quotes is left out with
probability P, except facts sharing a rare word (in at most two facts) with the query; the kept
facts are shuffled (seeded). The short-context phase is where a run learns the final polarity
first, so accuracy on this set shows it before the full set does (docs/results-prontoqa.md, "A shared negation
direction at initialisation").

    python3 experiments/prontoqa_short_valid.py data/prontoqa/valid.json short.json 0.9
    build/coconut eval --model RUN/checkpoint-N --data short.json --out p.jsonl
    python3 experiments/prontoqa_chains.py p.jsonl short.json

Standard library only; seed 1.
"""
import json
import random
import re
import sys


def words(sentence):
    return re.findall(r"[A-Za-z0-9]+", sentence)


def main():
    source, target, probability = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rng = random.Random(1)
    shortened = []
    for item in json.load(open(source)):
        sentences = [s.strip() for s in re.findall(r"[^.?!]*[.?!](?= |$)", item["question"])]
        query, facts = sentences[-1], sentences[:-1]
        fact_words = [words(fact) for fact in facts]
        matches_query = [False] * len(facts)
        for word in words(query):
            holders = [i for i, found in enumerate(fact_words) if word in found]
            if len(holders) <= 2:
                for i in holders:
                    matches_query[i] = True
        kept = [fact for i, fact in enumerate(facts)
                if any(fact in step for step in item["steps"]) or matches_query[i] or rng.random() >= probability]
        rng.shuffle(kept)
        item = dict(item)
        item["question"] = " ".join(kept + [query])
        shortened.append(item)
    json.dump(shortened, open(target, "w"), indent=1)
    facts = sum(len(re.findall(r"[.?!](?= |$)", item["question"])) - 1 for item in shortened) / len(shortened)
    print(f"{len(shortened)} questions, {facts:.1f} facts each on average")


if __name__ == "__main__":
    main()
