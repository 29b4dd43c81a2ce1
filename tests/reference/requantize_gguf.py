"""A GGUF file with every projection (attention and MLP matrices) in one block format: each tensor
of IN dequantized by gguf-py and, where it is a projection, quantized again to TYPE; the rest (norms,
embedding, head) as stored; every metadata key copied.

    requantize_gguf.py IN.gguf OUT.gguf TYPE      (TYPE: Q8_0, Q4_0 or Q4_1)
"""
import sys

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def main():
    source_path, out_path, type_name = sys.argv[1:4]
    target = gguf.GGMLQuantizationType[type_name]
    source = gguf.GGUFReader(source_path)
    architecture = source.fields["general.architecture"].contents()
    out = gguf.GGUFWriter(out_path, architecture)
    for name, field in source.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            out.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            out.add_key_value(name, field.contents(), kind)
    for tensor in source.tensors:
        qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
        if tensor.name.split(".")[-2] in PROJECTIONS:
            values = dequantize(tensor.data, qtype).astype(np.float32)
            out.add_tensor(tensor.name, quantize(values, target), raw_dtype=target)
        elif qtype == gguf.GGMLQuantizationType.F32:
            out.add_tensor(tensor.name, np.asarray(tensor.data, dtype=np.float32))
        else:
            out.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=qtype)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


if __name__ == "__main__":
    main()
