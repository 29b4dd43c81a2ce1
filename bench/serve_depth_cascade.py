#!/usr/bin/env python3
"""The any-depth model served with its depth cascade against every layer and a fixed prefix.

Starts `coconut serve --model models/prosqa-coconut-anydepth` once, then sends the 300 released
ProsQA questions (data/prosqa/valid.json) as greedy requests from CLIENTS concurrent clients, for
each depth policy in turn: the model's default (coconut.json's cascade 5 -> 8), `depth_cascade:
"off"` (every layer) and `depth_budget: 5` (the first 5 layers). With `--model
models/prosqa-coconut-layersets`: its default (the cascade over layer sets), every layer, and the
static sub-stack without layers 1, 3, 5 (a one-level cascade `{1,3,5}@0`). Each policy runs ROUNDS times,
alternating; prints per policy the best wall time, questions per second, its ratio to every layer
measured in the same run, accuracy (the text after the last '#'), the mean of usage.flops and the
share of questions the cascade deepened. Standard library only.

    bench/serve_depth_cascade.py [--rounds 3] [--clients 8] [--coconut build/coconut] [--model models/prosqa-coconut-layersets]
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = {
    "models/prosqa-coconut-anydepth": [("every layer", {"depth_cascade": "off"}), ("first 5 layers", {"depth_budget": 5}),
                                       ("cascade 5 -> 8 (coconut.json)", {})],
    "models/prosqa-coconut-layersets": [("every layer", {"depth_cascade": "off"}),
                                        ("without 1, 3, 5 (static)", {"depth_cascade": "{1,3,5}@0"}),
                                        ("layer sets {1,3,5,7} -> {1,5} (coconut.json)", {})],
}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(port, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.load(reply)


def answer(text):
    return text[text.rfind("#") + 1:].replace(",", "").strip()


def run_policy(port, questions, extra, clients):
    def one(example):
        body = {"prompt": example["question"] + "\n", "max_tokens": 64, "temperature": 0, **extra}
        return example, post(port, body)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(one, questions))
    seconds = time.perf_counter() - start
    right = sum(answer(reply["choices"][0]["text"]) == answer(example["answer"]) for example, reply in replies)
    flops = sum(reply["usage"]["flops"] for _, reply in replies) / len(replies)
    deepened = sum(len(reply["usage"].get("depth_cascade", [])) > 1 for _, reply in replies) / len(replies)
    return seconds, right / len(replies), flops, deepened


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--coconut", default=os.path.join(ROOT, "build/coconut"))
    parser.add_argument("--model", default="models/prosqa-coconut-anydepth", choices=sorted(POLICIES))
    args = parser.parse_args()
    policies = POLICIES[args.model]
    with open(os.path.join(ROOT, "data/prosqa/valid.json")) as file:
        questions = json.load(file)
    port = free_port()
    server = subprocess.Popen([args.coconut, "serve", "--model", os.path.join(ROOT, args.model),
                               "--port", str(port), "--max-batch", str(args.clients)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit("coconut serve exited with status %d" % server.returncode)
                time.sleep(0.1)
        best = {}
        for _ in range(args.rounds):
            for name, extra in policies:
                result = run_policy(port, questions, extra, args.clients)
                if name not in best or result[0] < best[name][0]:
                    best[name] = result
    finally:
        server.terminate()
        server.wait()
    full_seconds = best["every layer"][0]
    full_flops = best["every layer"][2]
    print(f"{len(questions)} questions, {args.clients} clients, best of {args.rounds} rounds")
    print(f"| policy | seconds | questions/s | time vs every layer | accuracy | MFLOP / answer | FLOPs vs every layer | deepened |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in policies:
        seconds, accuracy, flops, deepened = best[name]
        print(f"| {name} | {seconds:.2f} | {len(questions) / seconds:.1f} | {seconds / full_seconds:.2f} | {accuracy:.1%} | "
              f"{flops / 1e6:.0f} | {flops / full_flops:.3f} | {deepened:.1%} |")


if __name__ == "__main__":
    main()
