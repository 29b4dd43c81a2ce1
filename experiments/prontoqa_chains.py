#!/usr/bin/env python3
"""Where a ProntoQA chain goes wrong: reads `coconut eval --out` predictions and sorts every
generated rule by kind and by whether it exists in the question and is the gold step.

    python3 experiments/prontoqa_chains.py predictions.jsonl data/prontoqa/valid.json

Rules are compared by meaning: "Each wumpus is a tumpus", "Every wumpus is a tumpus" and
"Wumpuses are tumpuses" are the same rule (subject, polarity, object). Reported:
  first_class   the first step names the class the gold chain starts from (the hop-1 branch)
  is_a_present  generated class rules ("X are Y", Y a class) that exist in the question
  is_a_gold     ... that are the gold chain's rule at that hop
  property_ok   the last rule (a property) exists in the question with the polarity generated
  chains_exact  every generated step equals the gold steps
  conclusion_ok the generated conclusion (last sentence before ###) is the gold one
  answer_follows the answer is the one the generated conclusion implies (True iff it is the query)
  accuracy      answers scored by eval
Standard library only.
"""
import json
import re
import sys
from collections import Counter


def singular(word):
    word = word.lower()
    if word.endswith("uses"):
        return word[:-2]
    if word.endswith("es") and word[:-2].endswith("us"):
        return word[:-2]
    return word


RULE_FORMS = [
    re.compile(r"^(?:Each|Every) (\w+) is (not )?an? (\w+)$"),   # Each X is a Y (a class)
    re.compile(r"^(?:Each|Every) (\w+) is (not )?(\w+)$"),        # Each X is Y (a property)
    re.compile(r"^(\w+) are (not )?(\w+)$"),                       # Xes are Yes / Xes are Y
]
ENTITY_FORM = re.compile(r"^([A-Z]\w+) is (not )?(?:an? )?(\w+)$")


def sentences(text):
    return [s.strip() for s in re.split(r"[.]", text) if s.strip()]


def parse_rule(sentence):
    """(subject, negated, object, object_is_class) or None. Classes are the -pus words."""
    for form in RULE_FORMS:
        match = form.match(sentence)
        if match:
            subject, negated, obj = match.groups()
            obj_singular = singular(obj)
            return (singular(subject), bool(negated), obj_singular, obj_singular.endswith("pus"))
    return None


def facts_of(question):
    rules, entity_classes = set(), []
    for sentence in sentences(question.split("True or false:")[0]):
        rule = parse_rule(sentence)
        if rule and not ENTITY_FORM.match(sentence):
            rules.add(rule)
        else:
            entity = ENTITY_FORM.match(sentence)
            if entity:
                entity_classes.append(singular(entity.group(3)))
    return rules, entity_classes


def generated_rules(text):
    out = []
    for sentence in sentences(text.split("###")[0]):
        rule = parse_rule(sentence)
        if rule:
            out.append(rule)
    return out


def main(predictions_path, data_path):
    data = json.load(open(data_path))
    counts = Counter()
    for line in open(predictions_path):
        prediction = json.loads(line)
        example = data[prediction["index"]]
        rules, _ = facts_of(example["question"])
        gold = [r for step in example["steps"] for r in generated_rules(step)]
        generated = generated_rules(prediction["generated"])
        counts["questions"] += 1
        counts["correct"] += bool(prediction["correct"])
        gold_first = sentences(example["steps"][0])[0]
        generated_first = sentences(prediction["generated"])[0] if prediction["generated"] else ""
        counts["first_class"] += generated_first == gold_first
        generated_steps = sentences(prediction["generated"].split("###")[0])
        gold_steps = [s for step in example["steps"] for s in sentences(step)]
        counts["chains_exact"] += generated_steps == gold_steps
        for hop, rule in enumerate(generated):
            if rule[3]:
                counts["is_a"] += 1
                counts["is_a_present"] += rule in rules
                counts["is_a_gold"] += hop < len(gold) and rule == gold[hop]
        conclusion = generated_steps[-1] if generated_steps else ""
        query = example["question"].split("True or false:")[-1].strip().rstrip(".")
        counts["conclusion_ok"] += conclusion == gold_steps[-1]
        counts["answer_follows"] += prediction["predicted"] == ("True" if conclusion == query else "False")
        properties = [rule for rule in generated if not rule[3]]
        if properties:
            counts["property_rules"] += 1
            counts["property_ok"] += properties[-1] in rules
    questions = counts["questions"]
    report = {
        "questions": questions,
        "accuracy": counts["correct"] / questions,
        "first_class": counts["first_class"] / questions,
        "chains_exact": counts["chains_exact"] / questions,
        "is_a_present": counts["is_a_present"] / max(1, counts["is_a"]),
        "is_a_gold": counts["is_a_gold"] / max(1, counts["is_a"]),
        "property_ok": counts["property_ok"] / max(1, counts["property_rules"]),
        "conclusion_ok": counts["conclusion_ok"] / questions,
        "answer_follows": counts["answer_follows"] / questions,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
