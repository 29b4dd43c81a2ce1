#!/usr/bin/env python3
"""Writes the depth cascade a `coconut eval --summary` chose (its depths or layer sets and calibrated confidence)
into a model folder's coconut.json, so that plain `coconut eval` and `coconut serve` run it.

    experiments/write_depth_cascade.py MODEL_DIR/coconut.json SUMMARY.json
"""
import json
import sys

settings_path, summary_path = sys.argv[1], sys.argv[2]
with open(settings_path) as file:
    settings = json.load(file)
with open(summary_path) as file:
    cascade = json.load(file)["depth_cascade"]
levels = "removed" if "removed" in cascade else "depths"
settings["depth_cascade"] = {levels: cascade[levels], "confidence": cascade["confidence"]}
with open(settings_path, "w") as file:
    json.dump(settings, file, indent=2)
