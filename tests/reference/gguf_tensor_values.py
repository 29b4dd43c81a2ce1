"""gguf-py's reading of a GGUF file's tensors, for comparison with coconut's reader.

Usage: gguf_tensor_values.py FILE.gguf OUT.json
Writes, per tensor: its ggml type, its numpy shape (rows first: ggml's dims reversed) and the
values (as float64, dequantized by gguf-py where quantized) at a fixed set of row-major flat
indices: all of them for tensors up to 512 values, else the first and last 16 and 64 spread
between. Run by tests/io_gguf_test.cpp in the test venv (./run test makes it).
"""
import json
import sys

import gguf
import numpy as np
from gguf.quants import dequantize


def main(path, out):
    reader = gguf.GGUFReader(path)
    result = {}
    for tensor in reader.tensors:
        data = tensor.data
        if tensor.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = dequantize(data, tensor.tensor_type)
        data = np.asarray(data, dtype=np.float64)
        flat = data.reshape(-1)
        n = flat.size
        if n <= 512:
            indices = list(range(n))
        else:
            spread = np.linspace(16, n - 17, 64).astype(np.int64).tolist()
            indices = sorted(set(list(range(16)) + spread + list(range(n - 16, n))))
        result[tensor.name] = {
            "type": tensor.tensor_type.name,
            "shape": [int(d) for d in data.shape],
            "indices": indices,
            "values": [float(flat[i]) for i in indices],
        }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
