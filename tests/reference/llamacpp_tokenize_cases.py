"""llama.cpp's ids for the texts of a cases file, with a GGUF's tokenizer:

    llamacpp_tokenize_cases.py GGUF LLAMA_TOKENIZE CASES_IN.jsonl OUT.jsonl [--every N]

OUT.jsonl: {"text", "ids", "source": "llama.cpp"} for every Nth text of CASES_IN (ids without BOS,
special tokens parsed, as llama-tokenize --stdin --ids --no-bos --no-escape gives them). Made the
gpt-2 and default pre-tokenizer cases under tests/fixtures/tokenizers/smollm2/ from GGUFs that
make_tiny_gguf.py --pre wrote.
"""
import argparse
import json

from make_smollm2_tokenizer_cases import dump_line, llamacpp_ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("llama_tokenize")
    parser.add_argument("cases")
    parser.add_argument("out")
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args()
    with open(args.cases) as cases, open(args.out, "w") as out:
        for number, line in enumerate(cases):
            if number % args.every:
                continue
            text = json.loads(line)["text"]
            out.write(dump_line({"text": text, "ids": llamacpp_ids(args.llama_tokenize, args.gguf, text), "source": "llama.cpp"}) + "\n")


if __name__ == "__main__":
    main()
