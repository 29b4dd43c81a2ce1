#!/usr/bin/env python3
"""Hostile load against an OpenAI-style completions server (coconut serve or llama.cpp's llama-server).

Usage:
    serve_hostile_load.py --port PORT --pid PID [--half 1000] [--idle 1000] [--normal 20]
                          [--aborted 10000] [--rounds 3] [--spread 15] [--prompt TEXT] [--max-tokens 8]
                          [--timeout 30]

Cases, in order, on loopback, bounded in count and time:
  1. `--half` connections send half a request head and then one more header line every 2 s
     (the slowloris pattern), and `--idle` connections send one GET /health, read its answer and
     stay open (idle keep-alive); while all of them are held, `--normal` completions are sent one
     after the other on fresh connections, spread over `--spread` s (long enough for a server's
     deadlines to come): their latency (p50, p99, worst) and how many failed within `--timeout` s.
  2. How many of the half-sent and idle connections the server still holds (its open file
     descriptors, from /proc/PID/fd) and how many it closed.
  3. `--rounds` rounds of `--aborted` requests aborted by the client (half of them a complete
     streamed request reset right after sending, half a head cut short), 32 at a time; after each,
     one more normal completion (still served?) and the server's resident memory and descriptors:
     a leak grows with every round, allocator warm-up only in the first.
Prints one JSON object (and a line per case on stderr). Standard library only.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def completion(port, prompt, max_tokens, timeout, stream=False):
    """One POST /v1/completions on a fresh connection; returns (seconds, status) or (seconds, error)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(max(0.1, timeout - (time.monotonic() - start)))
            s.sendall(head + body)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else "no answer"
        return time.monotonic() - start, status
    except OSError as error:
        return time.monotonic() - start, type(error).__name__


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--half", type=int, default=1000)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--normal", type=int, default=20)
    parser.add_argument("--aborted", type=int, default=10000)
    parser.add_argument("--spread", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", default="Every wumpus is a tumpus. Max is a wumpus. True or false: Max is a tumpus.")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    port, pid = args.port, args.pid
    result = {"half": args.half, "idle": args.idle}

    # Warm-up: the first request pays for lazy initialisation.
    completion(port, args.prompt, args.max_tokens, args.timeout)
    result["rss_before_kib"], result["fds_before"] = rss_kib(pid), open_fds(pid)

    # 1. Slow and idle connections held while normal requests go through.
    half, idle = [], []
    for _ in range(args.half):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            half.append(s)
        except OSError:
            break
    for _ in range(args.idle):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            s.settimeout(5)
            s.recv(65536)
            idle.append(s)
        except OSError:
            break
    result["half_opened"], result["idle_opened"] = len(half), len(idle)
    stop = threading.Event()

    def drip():  # one more header line every 2 s on every half-sent connection
        n = 0
        while not stop.wait(2):
            for s in half:
                try:
                    s.sendall(f"X-Slow-{n}: 1\r\n".encode())
                except OSError:
                    pass
            n += 1

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    result["fds_held"] = open_fds(pid)
    latencies, failures = [], []
    began = time.monotonic()
    for i in range(args.normal):
        time.sleep(max(0.0, began + i * args.spread / args.normal - time.monotonic()))
        seconds, status = completion(port, args.prompt, args.max_tokens, args.timeout)
        latencies.append(seconds)
        if status != 200:
            failures.append(status)
    stop.set()
    dripper.join()
    result["normal"] = {"count": args.normal, "failed": len(failures), "failures": [str(f) for f in failures[:5]],
                        "p50_s": statistics.median(latencies), "p99_s": percentile(latencies, 0.99),
                        "worst_s": max(latencies)}
    print(f"normal completions beside {len(half)} half-sent and {len(idle)} idle connections: "
          f"p50 {result['normal']['p50_s'] * 1000:.1f} ms, p99 {result['normal']['p99_s'] * 1000:.1f} ms, "
          f"{len(failures)} of {args.normal} failed", file=sys.stderr)

    # 2. What the server still holds of them.
    def closed_by_server(sockets):
        count = 0
        for s in sockets:
            try:
                s.setblocking(False)
                data = s.recv(65536)
                if data == b"" or data.startswith(b"HTTP/1.1 408"):
                    count += 1
            except BlockingIOError:
                pass
            except OSError:
                count += 1
        return count

    result["fds_after_normal"] = open_fds(pid)
    result["half_closed_by_server"] = closed_by_server(half)
    result["idle_closed_by_server"] = closed_by_server(idle)
    print(f"server descriptors: {result['fds_before']} before, {result['fds_held']} while held; "
          f"it closed {result['half_closed_by_server']} half-sent and {result['idle_closed_by_server']} idle",
          file=sys.stderr)
    for s in half + idle:
        s.close()

    # 3. Aborted requests, then memory and descriptors.
    body = json.dumps({"prompt": args.prompt, "max_tokens": 64, "stream": True}).encode()
    full = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    cut = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
    counter = iter(range(0))
    lock = threading.Lock()

    def abort_some():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(full if i % 2 == 0 else cut)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
            except OSError:
                pass

    result["rounds"] = []
    for round_index in range(args.rounds):
        counter = iter(range(args.aborted))
        start = time.monotonic()
        threads = [threading.Thread(target=abort_some) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds_aborting = time.monotonic() - start
        time.sleep(3)  # streams already started finish or notice
        seconds, status = completion(port, args.prompt, args.max_tokens, args.timeout)
        time.sleep(1)
        result["rounds"].append({"aborted_seconds": seconds_aborting, "status": status, "seconds": seconds,
                                 "rss_kib": rss_kib(pid), "fds": open_fds(pid)})
    last = result["rounds"][-1]
    result["after_aborted"] = {"status": last["status"], "seconds": last["seconds"]}
    result["rss_after_kib"], result["fds_after"] = last["rss_kib"], last["fds"]
    growth = [b["rss_kib"] - a for a, b in zip([result["rss_before_kib"]] + [r["rss_kib"] for r in result["rounds"]],
                                               result["rounds"])]
    result["rss_growth_per_round_kib"] = growth
    print(f"{args.rounds} rounds of {args.aborted} aborted requests; then a completion: {last['status']} in "
          f"{last['seconds'] * 1000:.0f} ms; resident memory {result['rss_before_kib']} -> {result['rss_after_kib']} KiB "
          f"(per round: {', '.join(f'{g:+d}' for g in growth)} KiB), descriptors {result['fds_before']} -> "
          f"{result['fds_after']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
