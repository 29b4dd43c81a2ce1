#!/usr/bin/env python3
"""Regenerate tests/fixtures/tokenizers/smollm2/encode_cases.jsonl.

    make_smollm2_tokenizer_cases.py SmolLM2-135M-Instruct.Q4_1.gguf path/to/llama-tokenize [--out FILE]

Every string below is encoded two independent ways, without BOS/EOS, with special-token text
(`<|im_start|>`, `<|endoftext|>`, ...) parsed as special, as HF does by default:

  hf         transformers' own GGUF tokenizer conversion (vocab, merges and the 17 control tokens read
             from the GGUF's metadata), called as tok(text, add_special_tokens=False). The metadata is
             read with gguf-py, because transformers' GGUF reader imports torch. transformers has no
             split rule for the `smollm` pre-tokenizer and would fall back to GPT-2's (digit runs kept
             together), so the pre-tokenizer is set to the one in SmolLM2's published tokenizer.json:
             Digits(individual_digits=True) then ByteLevel(add_prefix_space=False, use_regex=True).
  llama.cpp  `llama-tokenize --stdin --ids --no-bos --no-escape --log-disable` (special tokens are
             parsed by default in llama-tokenize), text passed as raw UTF-8 bytes on stdin.

Lines where both agree get "source": "hf+llama.cpp". A line where they differ keeps the HF ids in
"ids", adds "ids_llamacpp", and gets "source": "disagree". "category" says what the string tests.

Needs: gguf, tokenizers, transformers (torch not needed).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "fixtures", "tokenizers", "smollm2", "encode_cases.jsonl")


def cases():
    """(category, text) pairs, in file order. Pure data: the same list every run."""
    out = []

    def add(category, *texts):
        for t in texts:
            out.append((category, t))

    add("empty", "")

    add("single_char",
        "a", "A", "z", "0", "9", " ", ".", ",", "!", "'", '"', "\\", "<", ">", "|", "\n", "\t", "\r",
        "é", "ß", "中", "😀", "\u200b", "\u0120", "\u010a", "€", "~", "_")

    add("prose",
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "The capital of France is",
        "The capital of France is Paris.",
        "Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the park with her friends.",
        "It was the best of times, it was the worst of times.",
        "To be, or not to be: that is the question.",
        "All happy families are alike; each unhappy family is unhappy in its own way.",
        "Machine learning models are trained on large datasets.",
        "Gradient descent minimises the loss one small step at a time.",
        "Please summarise the following paragraph in two sentences.",
        "What is the difference between a list and a tuple in Python?",
        "I think, therefore I am.",
        "HELLO WORLD IN CAPITALS",
        "camelCaseIdentifier and snake_case_identifier and kebab-case-identifier",
        "Mr. Smith went to Washington D.C. on Jan. 5th.",
        "e.g. i.e. etc. vs. a.m. p.m.",
        "Supercalifragilisticexpialidocious antidisestablishmentarianism",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        "The the THE tHe",
        "hello\nworld",
        "First line.\nSecond line.\n\nNew paragraph.",
        "pneumonoultramicroscopicsilicovolcanoconiosis")

    add("contraction",
        "don't", "I'm", "you're", "we've", "she'll", "he'd", "it's", "can't won't shouldn't",
        "DON'T", "I'M", "YOU'RE", "WE'VE", "SHE'LL", "HE'D", "IT'S", "It'S", "We'Ve",
        "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
        "y'all'd've", "rock 'n' roll", "O'Neil's dog's bowl", "the dogs' bowls",
        "it\u2019s a curly apostrophe", "'quoted'", "I'd've", "that's what she'd said")

    add("digits",
        "42", "123", "1234567890", "3.14159", "1,000,000", "2024-06-01", "12:30:45",
        "+1 (555) 123-4567", "0x1F 0xDEADBEEF", "1e-9 6.022e23", "99 bottles of beer", "v1.2.3",
        "$19.99", "100%", "-273.15", "a1b2c3", "x=10;y=20", "1 2 3", " 7", "  123", "007",
        "3141592653589793238462643383279502884197169399375105820974944592",
        "In 1969, 3 astronauts flew 384400 km.",
        "\uff11\uff12\uff13",            # fullwidth digits
        "\u0663\u0664\u0665",            # Arabic-Indic digits
        "\u2167 \u216b",                 # Roman numerals (Nl)
        "\u00bd \u00be \u2153",          # vulgar fractions (No)
        "\u2460\u2461\u2462",            # circled digits (No)
        "x\u00b2 + y\u00b3 = z\u2074",   # superscripts (No)
        "\u0968\u0966\u0968\u0967",      # Devanagari digits
        "12abc34", "abc 123 def 4567")

    add("whitespace",
        "  ", "   ", "    ", " " * 8, " " * 16, "\t\t", "\t\t\t", "\n\n", "\n\n\n", "\n" * 6,
        "\r\n", "\r\n\r\n", " \n", "\n ", " \t \n", "\t \t", " \n \n ",
        "hello  world", "hello   world", "hello\tworld", "hello\t\tworld",
        " hello", "  hello", "   hello", "\thello", "\nhello",
        "hello ", "hello  ", "hello\n", "hello\n\n", "hello \n", "hello  \nworld",
        "line1\nline2\r\nline3\rline4", "a \n b", "    indented line", "\n\n\nabc\n\n\n",
        "x \u00a0 y", "\u00a0", "a\u3000b", "a\u2003b", "\v\f", "a\u2028b\u2029c", "a\u0085b",
        "  leading and trailing  ", "\t\n\r ", "word\n\tindented\n\t\tmore")

    add("unicode",
        "café", "naïve résumé", "Führer", "Straße", "Ångström", "São Paulo", "Crème brûlée",
        "Ça va? Très bien.", "Zürich Köln Wien", "Łódź Kraków", "Dvořák", "İstanbul ılık",
        "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
        "Привет, мир!", "Съешь же ещё этих мягких французских булок",
        "你好，世界", "我爱自然语言处理。", "日本語のテキストです", "カタカナとひらがな",
        "한국어 문장입니다", "สวัสดีครับ", "नमस्ते दुनिया", "வணக்கம்",
        "مرحبا بالعالم", "שלום עולם", "abc שלום def", "\u202eevil\u202c", "\u200fRTL mark\u200e",
        "😀", "😀😃😄😁", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇫🇷🇯🇵", "❤️", "I ❤️ NY 🗽",
        "e\u0301", "\u00e9 vs e\u0301", "a\u0308\u0304", "Z\u0351\u036b\u0343\u036a\u0302a\u0306l\u0325g\u0327o",
        "zero\u200bwidth\u200bspace", "zw\u200cnj", "zw\u200dj", "\ufeffBOM at start",
        "word\u2060joiner", "soft\u00adhyphen",
        "∑∫√∞ ≠ ≤ ≥ ±", "→ ← ↑ ↓ ⇒", "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",
        "\U00010300\U00010301\U00010302", "\ue000 private use", "℃ ℉ Ω µ", "ﬁ ligature ﬀ",
        "control \x01\x02\x07\x1b chars", "nul\x00byte", "Ġ Ċ ĉ literal byte-level chars",
        "\u00c3\u00a9 mojibake")

    add("punctuation",
        "!!!", "?!?!", "...", "…", "---", "===", "***", "<<<>>>", "(((", ")))", "[[]]", "{{}}",
        "\"quoted\"", "«guillemets»", "„German“", "“curly”", "—em dash—", "a.b.c", "@user #hashtag",
        "http://example.com/path?query=1&b=2#frag", "email@example.com", ":-) ;-( :D", "¡Hola! ¿Qué tal?",
        "~/.bashrc", "|||", "&&||;;", "#!/bin/sh", "....!!!!????", " .", " ...", "Hello... world!!!",
        "(a), [b], {c}", "50% off!!! (today only)", "a--b", "-- --- ----")

    add("code_python",
        "def add(a, b):\n    return a + b\n",
        "class Foo:\n    def __init__(self, x):\n        self.x = x\n",
        "squares = [x**2 for x in range(10) if x % 2 == 0]",
        "@decorator\ndef f(*args, **kwargs):\n\tpass\n",
        "print(f\"{name!r:>10} = {value:.3f}\")",
        "if __name__ == \"__main__\":\n    main()\n",
        "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
        "# comment with trailing spaces   \n",
        "lambda x: x['key'] or None")

    add("code_cpp",
        "#include <iostream>\n\nint main() {\n    std::cout << \"Hello\" << std::endl;\n    return 0;\n}\n",
        "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }",
        "auto f = [&](int x) -> int { return x * 2; };",
        "std::vector<std::pair<int, std::string>> v{{1, \"a\"}, {2, \"b\"}};",
        "for (size_t i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
        "/* block comment */ // line comment",
        "ptr->field = nullptr; obj.method(); ns::Type::value;")

    add("code_json",
        "{\"name\": \"coconut\", \"version\": 1, \"tags\": [\"a\", \"b\"], \"ok\": true, \"x\": null}",
        "{\n  \"nested\": {\n    \"array\": [1, 2, 3],\n    \"float\": -1.5e-3\n  }\n}",
        "[{\"id\":1},{\"id\":2}]",
        "{\"text\": \"line\\nbreak \\\"quote\\\" \\u00e9\"}")

    add("code_shell",
        "ls -la /tmp | grep foo > out.txt 2>&1",
        "for f in *.txt; do echo \"$f\"; done",
        "export PATH=\"$HOME/bin:$PATH\" && cd ~/src && make -j4",
        "cat <<'EOF'\nhello $USER\nEOF\n",
        "git commit -m 'fix: handle edge case' --amend")

    add("code_other",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "<div class=\"box\"><p>Hello &amp; welcome</p></div>",
        "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
        "all:\n\t$(CC) -o $@ $^\n",
        "--- a/file\n+++ b/file\n@@ -1,3 +1,3 @@\n-old\n+new\n",
        "key: value\nlist:\n  - one\n  - two\n",
        "# Title\n\n* item one\n* item two\n\n```\ncode\n```\n")

    add("special",
        "<|im_start|>user\nHi<|im_end|>\n",
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>assistant\nThe answer is 4.<|im_end|>\n<|endoftext|>",
        "text<|endoftext|>more text",
        "<|endoftext|><|endoftext|>",
        " <|im_end|> ",
        "\n<|im_start|>\n",
        "Hello<|im_end|>world",
        "<repo_name>coconut<file_sep>src/main.cpp",
        "<reponame>x<filename>a.py\nprint(1)",
        "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "<jupyter_text>Some text<jupyter_script>",
        "<gh_stars>100",
        "<issue_start>Title<issue_comment>Body<issue_closed>",
        "<|im_start", "<|im_end|", "|im_end|>", "<|IM_START|>", "< |im_end| >", "<|unknown|>",
        "<|endoftext|>\n\n", "<<|im_end|>>", "<|im_start|><|im_end|>")

    prose = ("Tokenizers split text into pieces that a language model can read. A byte-level BPE "
             "tokenizer starts from the 256 possible bytes and repeatedly merges the most frequent "
             "adjacent pair, so that common words become single tokens while rare words, numbers "
             "and unusual scripts fall back to shorter pieces. The pre-tokenizer decides where "
             "merges may never cross: between words, before punctuation, and, for SmolLM, between "
             "every single digit.")
    code = ("def fibonacci(n: int) -> list[int]:\n"
            "    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
            "    seq = [0, 1]\n"
            "    while len(seq) < n:\n"
            "        seq.append(seq[-1] + seq[-2])\n"
            "    return seq[:n]\n\n\n"
            "if __name__ == \"__main__\":\n"
            "    for i, value in enumerate(fibonacci(20)):\n"
            "        print(f\"{i:>3}: {value}\")\n")
    mixed = ("Le café coûte 3,50 € à Paris; 東京ではコーヒーが500円です. In Москва it is 250 ₽, "
             "and in القاهرة about 40 جنيه. 🚀✨ Prices change: 2023→2024 (+7.5%). "
             "Ελληνικά, עברית, हिन्दी and 한국어 all appear here.")
    add("long",
        prose,
        code,
        mixed,
        "".join(str(i % 10) for i in range(300)),
        "a" * 400,
        " ".join(["word"] * 120),
        "!?" * 150,
        "\n".join("line %d: the value is %d" % (i, i * i) for i in range(20)),
        "<|im_start|>user\n" + prose + "<|im_end|>\n<|im_start|>assistant\n",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
        "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco "
        "laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in "
        "voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat "
        "cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id est laborum.",
        "😀🎉👍🏽🇫🇷" * 30,
        "   \t\n" * 40)

    seen = set()
    unique = []
    for category, text in out:
        if text not in seen:
            seen.add(text)
            unique.append((category, text))
    return unique


def hf_tokenizer(gguf_path):
    """transformers' GGUF tokenizer conversion, with metadata read by gguf-py (no torch)."""
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                        convert_gguf_tokenizer)

    reader = GGUFReader(gguf_path)
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"]
                      for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                      if f"tokenizer.{key}" in metadata}
    assert tokenizer_dict["tokenizer_type"] == "gpt2", tokenizer_dict["tokenizer_type"]
    assert tokenizer_dict["pre_tokenizer_type"] == "smollm", tokenizer_dict["pre_tokenizer_type"]
    backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    stock = PreTrainedTokenizerFast(tokenizer_object=backend)
    # SmolLM2's tokenizer.json pre-tokenizer (llama.cpp: LLAMA_VOCAB_PRE_TYPE_SMOLLM).
    patched_backend = backend.__class__.from_str(backend.to_str())
    patched_backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=patched_backend), stock


def llamacpp_ids(llama_tokenize, gguf_path, text):
    cmd = [llama_tokenize, "-m", gguf_path, "--stdin", "--ids", "--no-bos", "--no-escape", "--log-disable"]
    proc = subprocess.run(cmd, input=text.encode("utf-8"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed ({proc.returncode}) on {text!r}: {proc.stderr.decode(errors='replace')}")
    return json.loads(proc.stdout.decode("utf-8").strip())


def dump_line(obj):
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    # keep one case per physical line for readers that split on Unicode line breaks
    return line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\u0085", "\\u0085")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("llama_tokenize")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    tok, stock = hf_tokenizer(args.gguf)
    agree = 0
    disagreements = []
    stock_differs = 0
    lines = []
    for category, text in cases():
        hf = tok(text, add_special_tokens=False)["input_ids"]
        lc = llamacpp_ids(args.llama_tokenize, args.gguf, text)
        if stock(text, add_special_tokens=False)["input_ids"] != hf:
            stock_differs += 1
        entry = {"text": text, "ids": hf}
        if hf == lc:
            entry["source"] = "hf+llama.cpp"
            agree += 1
        else:
            entry["ids_llamacpp"] = lc
            entry["source"] = "disagree"
            disagreements.append((category, text, hf, lc))
        entry["category"] = category
        lines.append(dump_line(entry))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")

    print(f"{len(lines)} cases -> {args.out}: {agree} agree, {len(disagreements)} disagree; "
          f"stock transformers conversion (GPT-2 split) differs from the smollm split on {stock_differs}",
          file=sys.stderr)
    for category, text, hf, lc in disagreements:
        print(f"  DISAGREE [{category}] {text!r}\n    hf       {hf}\n    llama.cpp {lc}", file=sys.stderr)


if __name__ == "__main__":
    main()
