#!/usr/bin/env python3
"""A training config without its `model:` block (and without the other top-level keys named), for
a run that starts from a checkpoint, which brings its own shape: the three experiment scripts that
continue a shipped or earlier model from a from-scratch recipe use it.

    python3 experiments/config_without_model.py CONFIG.yaml OUT.yaml [KEY ...]

Every other line is kept as it is, comments included. Standard library only.
"""
import sys


def main(source, out, dropped_keys):
    lines, inside_model = [], False
    for line in open(source).read().split("\n"):
        if line.startswith("model:"):
            inside_model = True
            continue
        if inside_model and line.startswith("  "):
            continue
        inside_model = False
        if not any(line.startswith(key + ":") for key in dropped_keys):
            lines.append(line)
    open(out, "w").write("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
