"""Rows of float32 values and gguf-py's Q8_0, Q4_0 and Q4_1 quantizations of them (its ports of ggml's
reference quantizers, quantize_row_q8_0_ref / q4_0_ref / q4_1_ref), for
tests/model_quantized_linear_test.cpp.

Writes OUT/input.f32 ([ROWS, COLUMNS] float32), OUT/q8_0.bin (the blocks, [ROWS, COLUMNS / 32 * 34]
bytes) and OUT/dequantized.f32 (gguf-py's dequantization of those blocks), OUT/q4_0.bin and
OUT/q4_0.f32, OUT/q4_1.bin and OUT/q4_1.f32 the same for the 4-bit formats, all raw little-endian.
Row 0 holds ties (values that land exactly on k + 0.5 steps), row 1 a zero block, the rest random
values of scales from 1e-3 to 1e3.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

ROWS, COLUMNS = 6, 96


def main(out):
    rng = np.random.default_rng(20261127)
    values = rng.normal(0, 1, size=(ROWS, COLUMNS)) * 10.0 ** rng.uniform(-3, 3, size=(ROWS, 1))
    values[0, :32] = np.concatenate([[127.0], np.arange(-15, 16) + 0.5])  # d = 1: ties at every .5
    values[1, 32:64] = 0.0
    values = values.astype(np.float32)
    blocks = quantize(values, GGMLQuantizationType.Q8_0)
    assert blocks.shape == (ROWS, COLUMNS // 32 * 34), blocks.shape
    values.tofile(out + "/input.f32")
    blocks.astype(np.uint8).tofile(out + "/q8_0.bin")
    dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float32).tofile(out + "/dequantized.f32")
    for name, kind, size in (("q4_0", GGMLQuantizationType.Q4_0, 18), ("q4_1", GGMLQuantizationType.Q4_1, 20)):
        blocks = quantize(values, kind)
        assert blocks.shape == (ROWS, COLUMNS // 32 * size), blocks.shape
        blocks.astype(np.uint8).tofile(out + "/" + name + ".bin")
        dequantize(blocks, kind).astype(np.float32).tofile(out + "/" + name + ".f32")


if __name__ == "__main__":
    main(sys.argv[1])
