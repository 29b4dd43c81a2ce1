#!/usr/bin/env python3
"""The largest micro-batch of a training job that fits a memory share on a GPU.

A job's peak memory is the last lease's measured peak for its kind
(configs/smollm2/memory_measured.txt, the row measured at the nearest batch), scaled by what
`coconut info` plans for this batch against the measured one: the plan gives the shape
(activations per row, the head's labelled rows, the thoughts' caches), the measured figure the
lease's own allocator and padding. Candidates halve the effective batch (128, 64, ...), so the
schedule is unchanged: batch_size x gradient_accumulation_steps stays the effective batch.
Prints "MICRO ACCUMULATION" (the effective batch again and 1 when no row of the kind is known).
"""
import argparse
import functools
import json
import math
import subprocess
import sys


@functools.lru_cache(maxsize=None)  # the measured batch's plan serves every candidate
def planned_bytes(coconut, model, batch, tokens, labelled, thoughts):
    command = [coconut, "info", model, "--json", "--world-size", "1", "--train-batch", str(batch),
               "--train-tokens", str(tokens), "--labelled-tokens", str(labelled)]
    if thoughts > 0:
        command += ["--latent-thoughts", str(thoughts), "--first-latent", str(tokens - labelled - thoughts)]
    report = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return report["training_memory"]["per_rank_bytes"]["total"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coconut", required=True, help="the coconut binary")
    parser.add_argument("--model", required=True, help="the base model folder (for coconut info)")
    parser.add_argument("--measured", required=True, help="the measured peaks (configs/smollm2/memory_measured.txt)")
    parser.add_argument("--kind", required=True, help="the job's kind, as the measured file names it")
    parser.add_argument("--batch", type=int, required=True, help="the effective batch (rows per optimizer step)")
    parser.add_argument("--share-mib", type=float, required=True, help="the memory this job may use, MiB")
    args = parser.parse_args()
    rows = []
    with open(args.measured) as measured:
        for line in measured:
            fields = line.split("#")[0].split()
            if fields and fields[0] == args.kind:
                rows.append([int(fields[1]), float(fields[2])] + [int(value) for value in fields[3:6]])
    if not rows:
        print(args.batch, 1)
        return
    micro = args.batch
    while True:
        # The measured row nearest this batch (by ratio; the larger of two as near), scaled by the plan.
        batch, peak, tokens, labelled, thoughts = min(rows, key=lambda row: (abs(math.log(row[0] / micro)), -row[0]))
        estimate = peak * (planned_bytes(args.coconut, args.model, micro, tokens, labelled, thoughts) /
                           planned_bytes(args.coconut, args.model, batch, tokens, labelled, thoughts))
        if estimate <= args.share_mib or micro % 2 or micro == 1:
            break
        micro //= 2
    print(f"pick_micro_batch: {args.kind}: {micro} rows of {args.batch} (planned peak {estimate:.0f} MiB of a "
          f"{args.share_mib:.0f} MiB share)", file=sys.stderr)
    print(micro, args.batch // micro)


if __name__ == "__main__":
    main()
