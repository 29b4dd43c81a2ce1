"""The official openai client against `coconut serve`: one chat completion, then the same streamed.

    openai_chat.py BASE_URL OUT.json

Waits up to 60 s for the server; OUT.json: text, finish_reason, role, streamed_text,
streamed_finish_reason.
"""
import json
import sys
import time

import openai


def main(base_url, out):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    deadline = time.time() + 60
    while True:
        try:
            client.models.list()
            break
        except openai.APIConnectionError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    reply = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=40)
    streamed, streamed_reason = "", None
    for chunk in client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0, max_tokens=40,
                                                stream=True):
        choice = chunk.choices[0]
        streamed += choice.delta.content or ""
        streamed_reason = choice.finish_reason or streamed_reason
    with open(out, "w") as file:
        json.dump({"text": reply.choices[0].message.content, "finish_reason": reply.choices[0].finish_reason,
                   "role": reply.choices[0].message.role, "streamed_text": streamed,
                   "streamed_finish_reason": streamed_reason}, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
