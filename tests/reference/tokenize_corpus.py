"""HF tokenizers' ids for every text of a corpus, from a tokenizer.json (ours, as the importer wrote
it): checks that the file means to HF what it means to us.

    tokenize_corpus.py TOKENIZER_JSON CASES_JSONL OUT_JSON

OUT_JSON: [{"text", "ids", "decoded"}] with ids as Tokenizer.encode(text, add_special_tokens=False).
"""
import json
import sys

from tokenizers import Tokenizer


def main(tokenizer_path, cases_path, out_path):
    tokenizer = Tokenizer.from_file(tokenizer_path)
    out = []
    with open(cases_path) as cases:
        for line in cases:
            text = json.loads(line)["text"]
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            out.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=False)})
    with open(out_path, "w") as file:
        json.dump(out, file, ensure_ascii=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
