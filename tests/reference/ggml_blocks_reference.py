"""Random blocks of every ggml type coconut dequantizes, and gguf-py's own dequantization of them.

Writes OUT/blocks.gguf (one tensor per type, as stored) and OUT/reference.gguf (the same names,
float32, dequantized by gguf-py). Scale fields hold random finite float16 values (random bytes
there could be NaN or infinite); every other byte is random. Run by tests/io_ggml_blocks_test.cpp
in the test venv (./run test makes it).
"""
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

T = gguf.GGMLQuantizationType
# type -> byte offsets of its float16 scale fields inside a block
SCALES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
ROWS = 3


def main(out):
    rng = np.random.default_rng(20261127)
    blocks = gguf.GGUFWriter(out + "/blocks.gguf", "llama")
    reference = gguf.GGUFWriter(out + "/reference.gguf", "llama")
    for qtype, offsets in SCALES.items():
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        columns = 2 * block_size
        data = rng.integers(0, 256, size=(ROWS, columns // block_size, type_size), dtype=np.uint8)
        for offset in offsets:
            scale = rng.normal(0, 0.05, size=(ROWS, columns // block_size)).astype(np.float16)
            data[:, :, offset:offset + 2] = scale.view(np.uint8).reshape(ROWS, columns // block_size, 2)
        raw = data.reshape(ROWS, -1)
        blocks.add_tensor(qtype.name, raw, raw_dtype=qtype)  # rows of bytes
        reference.add_tensor(qtype.name, dequantize(raw, qtype).astype(np.float32))
    # Plain types: BF16 and F16 bit patterns of random values.
    values = rng.normal(0, 1, size=(ROWS, 64)).astype(np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    blocks.add_tensor("BF16", bf16.view(np.uint8).reshape(ROWS, -1), raw_dtype=T.BF16)
    reference.add_tensor("BF16", dequantize(bf16.view(np.uint8).reshape(ROWS, -1), T.BF16).astype(np.float32))
    blocks.add_tensor("F16", values.astype(np.float16))
    reference.add_tensor("F16", values.astype(np.float16).astype(np.float32))
    for writer in (blocks, reference):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
