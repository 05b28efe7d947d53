# A reader of .safetensors files for the tests (the format: an 8-byte little-endian header size,
# a JSON header of name -> dtype, shape, data_offsets, then the raw bytes), independent of tandem's.
import json
import struct

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}


def read_safetensors(path) -> dict:
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(blob[base + b:base + e]), dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out
