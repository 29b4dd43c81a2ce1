"""Renders chat templates with jinja2 as transformers' apply_chat_template does, for conversations
that test the branches (system first or not, several turns, whitespace to trim, unicode).

    render_chat_templates.py SMOLLM2_GGUF TEMPLATE_DIR OUT.json

OUT.json: [{"template": name, "jinja": text, "messages": [...], "rendered": text}, ...]
"""
import json
import sys

import gguf
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "  padded question \n"}, {"role": "assistant", "content": "An answer.\n\n"},
     {"role": "user", "content": "And then? caf\u00e9 \u2603"}],
    [{"role": "system", "content": "  spaced system  "}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


def render(text, messages):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(text)
    return template.render(messages=messages, add_generation_prompt=True, bos_token="<|begin_of_text|>",
                           eos_token="<|eot_id|>", strftime_now=lambda fmt: "27 Nov 2026")


def main(gguf_path, template_dir, out):
    reader = gguf.GGUFReader(gguf_path)
    templates = {"smollm2": reader.fields["tokenizer.chat_template"].contents()}
    for name in ("llama3", "llama32"):
        with open(f"{template_dir}/{name}.jinja") as file:
            templates[name] = file.read()
    cases = []
    for name, text in templates.items():
        for messages in CONVERSATIONS:
            cases.append({"template": name, "jinja": text, "messages": messages, "rendered": render(text, messages)})
    with open(out, "w") as file:
        json.dump(cases, file, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
